//! `segment=auto`: a node's segment is its NVLink domain, as `nvidia-smi -q` tells it (the
//! GPUs' fabric cluster UUID and clique id), when it has one (docs/PROTOCOL.md "Segments").

use std::path::Path;
use std::time::Duration;

use rdzv_core::ConfigError;

/// The value of the `segment` option that asks for the node's NVLink domain.
pub const AUTO: &str = "auto";

/// How long `nvidia-smi -q` may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// This node's NVLink domain, `<cluster UUID>.<clique id>` (the GPUs' fabric), from
/// `nvidia-smi -q` (`RDZV_NVIDIA_SMI` names another program to ask). A node without
/// nvidia-smi, without a fabric (GPUs not on an NVLink switch) or whose GPUs disagree is a
/// [`ConfigError`] that says so and what to give instead.
pub async fn nvlink_domain() -> Result<String, ConfigError> {
    let program = std::env::var_os("RDZV_NVIDIA_SMI").unwrap_or_else(|| "nvidia-smi".into());
    let shown = Path::new(&program).display().to_string();
    let query = tokio::process::Command::new(&program).arg("-q").kill_on_drop(true).output();
    let output = match tokio::time::timeout(QUERY_TIMEOUT, query).await {
        Err(_) => return Err(no_domain(&format!("`{shown} -q` did not answer within 30 s"))),
        Ok(Err(e)) => return Err(no_domain(&format!("cannot run `{shown} -q`: {e}"))),
        Ok(Ok(output)) if !output.status.success() => {
            return Err(no_domain(&format!("`{shown} -q` failed ({})", output.status)));
        }
        Ok(Ok(output)) => output,
    };
    domain_of(&String::from_utf8_lossy(&output.stdout)).map_err(|why| no_domain(&why))
}

fn no_domain(why: &str) -> ConfigError {
    ConfigError::InvalidValue {
        option: "segment".into(),
        value: AUTO.into(),
        reason: format!("{why}: this node has no NVLink domain to name its segment; give a label instead"),
    }
}

/// The NVLink domain `nvidia-smi -q`'s report names: every GPU's fabric `ClusterUUID` and
/// `CliqueId`, which must agree and not be unset (all zeros, `N/A`).
fn domain_of(report: &str) -> Result<String, String> {
    let field = |line: &str, name: &str| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == name).then(|| value.trim().to_string())
    };
    let clusters: Vec<String> = report.lines().filter_map(|l| field(l, "ClusterUUID")).collect();
    let cliques: Vec<String> = report.lines().filter_map(|l| field(l, "CliqueId")).collect();
    let unset = |v: &str| v.is_empty() || v == "N/A" || v.chars().all(|c| c == '0' || c == '-');
    let Some(cluster) = clusters.first() else {
        return Err("nvidia-smi reports no fabric (no ClusterUUID)".into());
    };
    if clusters.iter().any(|c| unset(c)) {
        return Err("the GPUs are on no NVLink fabric (ClusterUUID unset)".into());
    }
    if clusters.iter().any(|c| c != cluster) || cliques.windows(2).any(|w| w[0] != w[1]) {
        return Err("the GPUs of this node report different NVLink domains".into());
    }
    let label = match cliques.first() {
        Some(clique) => format!("{cluster}.{clique}"),
        None => cluster.clone(),
    };
    rdzv_core::ids::validate_id("segment", &label).map_err(|e| e.to_string())?;
    Ok(label)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const GPU: &str = "GPU 00000000:18:00.0
    Fabric
        State                             : Completed
        Status                            : Success
        CliqueId                          : 32766
        ClusterUUID                       : 8cbb1d1e-5c7e-4b6a-9d3e-0a1b2c3d4e5f
";

    #[test]
    fn the_domain_is_the_fabric_cluster_and_clique() {
        let two = format!("{GPU}{GPU}");
        assert_eq!(domain_of(&two).unwrap(), "8cbb1d1e-5c7e-4b6a-9d3e-0a1b2c3d4e5f.32766");
        assert!(domain_of("GPU 0\n    Product Name : H100\n").unwrap_err().contains("no fabric"));
        let unset =
            GPU.replace("8cbb1d1e-5c7e-4b6a-9d3e-0a1b2c3d4e5f", "00000000-0000-0000-0000-000000000000");
        assert!(domain_of(&unset).unwrap_err().contains("unset"));
        let other = format!("{GPU}{}", GPU.replace("32766", "1"));
        assert!(domain_of(&other).unwrap_err().contains("different"));
    }
}
