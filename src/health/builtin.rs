//! The built-in checks: `gpu` (the GPUs `nvidia-smi -L` lists), `disk` (free space) and
//! `store` (a round trip to the run's Store).

use std::path::Path;
use std::time::Duration;

use rdzv_store::Store;
use tokio::time::Instant;

use super::check::{Target, Verdict};

/// The program the `gpu` check asks; `RDZV_NVIDIA_SMI` names another (a wrapper, or a
/// driver installed off the `PATH`).
const NVIDIA_SMI: &str = "nvidia-smi";

/// At least `at_least` GPUs listed by `nvidia-smi -L`, and none in an error state.
pub(crate) async fn gpu(at_least: usize, deadline: Instant) -> Verdict {
    let program = std::env::var_os("RDZV_NVIDIA_SMI").unwrap_or_else(|| NVIDIA_SMI.into());
    let shown = Path::new(&program).display().to_string();
    let listed = tokio::process::Command::new(&program).arg("-L").kill_on_drop(true).output();
    let output = match tokio::time::timeout_at(deadline, listed).await {
        Err(_) => {
            return Verdict::Failed(format!("builtin gpu: `{shown} -L` did not answer in time (killed)"));
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Verdict::Failed(format!(
                "builtin gpu: `{shown}` not found: no NVIDIA driver on this node (the gpu check needs nvidia-smi)"
            ));
        }
        Ok(Err(e)) => return Verdict::Failed(format!("builtin gpu: cannot run `{shown} -L`: {e}")),
        Ok(Ok(output)) => output,
    };
    let text =
        String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Verdict::Failed(format!(
            "builtin gpu: `{shown} -L` failed ({}): {}",
            output.status,
            last_line(&text)
        ));
    }
    gpu_verdict(&text, at_least)
}

/// What `nvidia-smi -L`'s listing says: enough GPUs, none reported broken.
fn gpu_verdict(listing: &str, at_least: usize) -> Verdict {
    const BROKEN: [&str; 4] = ["ERR!", "Unable to determine", "fallen off the bus", "Unknown Error"];
    if let Some(line) = listing.lines().find(|line| BROKEN.iter().any(|b| line.contains(b))) {
        return Verdict::Failed(format!("builtin gpu: a GPU is in an error state: {}", line.trim()));
    }
    let count = listing.lines().filter(|line| line.trim_start().starts_with("GPU ")).count();
    if count < at_least {
        return Verdict::Failed(format!("builtin gpu: nvidia-smi lists {count} GPU(s); {at_least} expected"));
    }
    Verdict::Passed
}

/// At least `min_free` bytes available to unprivileged users on `path`'s file system.
pub(crate) async fn disk(path: &Path, min_free: u64, deadline: Instant) -> Verdict {
    let owned = path.to_path_buf();
    // A hung network file system blocks statvfs: off the runtime, and bounded.
    let stat = tokio::task::spawn_blocking(move || rustix::fs::statvfs(&owned));
    let shown = path.display();
    match tokio::time::timeout_at(deadline, stat).await {
        Err(_) => Verdict::Failed(format!("builtin disk: {shown} did not answer in time")),
        Ok(Err(e)) => Verdict::Failed(format!("builtin disk: {shown}: {e}")),
        Ok(Ok(Err(e))) => Verdict::Failed(format!("builtin disk: cannot stat {shown}: {e}")),
        Ok(Ok(Ok(stat))) => {
            let free = stat.f_bavail.saturating_mul(stat.f_frsize);
            if free >= min_free {
                Verdict::Passed
            } else {
                Verdict::Failed(format!(
                    "builtin disk: {shown} has {} free; {} needed",
                    size(free),
                    size(min_free)
                ))
            }
        }
    }
}

/// A write, a read and a delete of the node's key in the run's Store, all within `bound`.
pub(crate) async fn store(target: &Target, bound: Duration) -> Verdict {
    let prefix = format!("{}store/", target.keys.root()).into_bytes();
    let store = Store::new(target.kv.clone(), prefix).with_timeout(bound);
    let key = format!("rdzv/health/{}", target.node);
    let token = format!("{:?}", std::time::SystemTime::now());
    let started = Instant::now();
    let round_trip = async {
        store.set(&key, token.as_bytes()).await?;
        let read = store.get(&key).await?;
        store.delete_key(&key).await?;
        Ok::<_, rdzv_store::StoreError>(read)
    };
    match tokio::time::timeout(bound, round_trip).await {
        Err(_) => Verdict::Failed(format!(
            "builtin store: no write and read of the run's Store within {}",
            humantime::format_duration(bound)
        )),
        Ok(Err(e)) => Verdict::Failed(format!("builtin store: {e}")),
        Ok(Ok(read)) if read != token.as_bytes() => {
            Verdict::Failed("builtin store: the run's Store gave back another value than written".into())
        }
        Ok(Ok(_)) => {
            tracing::debug!(took = ?started.elapsed(), "builtin store check passed");
            Verdict::Passed
        }
    }
}

/// The last non-empty line of `text`.
fn last_line(text: &str) -> &str {
    text.lines().map(str::trim).rfind(|l| !l.is_empty()).unwrap_or("(no output)")
}

/// Bytes in words, in the largest binary unit that keeps a whole number above 0.
fn size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)];
    match UNITS.iter().find(|(_, unit)| bytes >= *unit) {
        Some((name, unit)) => format!("{:.1}{name}", bytes as f64 / *unit as f64),
        None => format!("{bytes}B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str =
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)\n";

    #[test]
    fn the_gpu_listing_is_counted_and_read_for_errors() {
        assert_eq!(gpu_verdict(LISTING, 2), Verdict::Passed);
        assert_eq!(
            gpu_verdict(LISTING, 8),
            Verdict::Failed("builtin gpu: nvidia-smi lists 2 GPU(s); 8 expected".into())
        );
        let broken =
            format!("{LISTING}Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error\n");
        assert!(matches!(gpu_verdict(&broken, 1), Verdict::Failed(why) if why.contains("error state")));
    }

    #[tokio::test]
    async fn disk_space_is_compared_with_the_least_asked() {
        let deadline = Instant::now() + Duration::from_secs(10);
        assert_eq!(disk(Path::new("/"), 1, deadline).await, Verdict::Passed);
        let short = disk(Path::new("/"), u64::MAX, deadline).await;
        assert!(matches!(&short, Verdict::Failed(why) if why.contains("free;")), "{short:?}");
        let missing = disk(Path::new("/no/such/dir"), 1, deadline).await;
        assert!(matches!(&missing, Verdict::Failed(why) if why.contains("cannot stat")), "{missing:?}");
    }

    #[test]
    fn sizes_read_as_words() {
        assert_eq!(size(512), "512B");
        assert_eq!(size(3 << 30), "3.0G");
        assert_eq!(size(1536), "1.5K");
    }
}
