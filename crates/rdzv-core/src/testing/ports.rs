//! Loopback ports for test servers that are stopped and started again on the same ports.
//!
//! A port the kernel hands out for `bind(0)` lies in its ephemeral range, the range it also
//! draws the local port of every outgoing connection from. While a test server is down
//! (killed for an outage test), a client connecting anywhere can be given that very port,
//! and the restarted server then fails with "address already in use". Ports chosen below
//! (or above) the ephemeral range are never handed out that way.
//!
//! Test servers running side by side (nextest runs eight test processes at once, the Python
//! tests beside them) choose from the same ports. A port is free when chosen and can be
//! another test's a moment later; and a server down for an outage test leaves its ports free
//! for seconds, where another test would take them and the restart would fail. So each chosen
//! port is also *claimed*: a file named after it in a directory all these helpers share,
//! holding the claiming process's id, which the others skip while that process lives.

use std::io::{self, Write};
use std::net::TcpListener;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::Once;
use std::time::{Duration, SystemTime};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Where Linux keeps its ephemeral range; its default when the file cannot be read.
const EPHEMERAL_RANGE_FILE: &str = "/proc/sys/net/ipv4/ip_local_port_range";
const DEFAULT_EPHEMERAL: (u16, u16) = (32768, 60999);
/// Below this, ports are commonly taken by system services.
const LOWEST: u16 = 10_000;

/// A port chosen for a test server, claimed for it: while the claim lives, no other caller of
/// [`claim_loopback_ports`] (in this or another process, the Python tests' helpers too)
/// chooses it, whether the server is up or down. Dropping it gives the port up.
#[derive(Debug)]
pub struct PortClaim {
    port: u16,
    file: PathBuf,
}

impl PortClaim {
    /// The claimed port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for PortClaim {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

/// [`free_loopback_ports`], each port also claimed until the returned claims are dropped.
pub fn claim_loopback_ports(n: usize) -> io::Result<Vec<PortClaim>> {
    choose(n, true).map(|chosen| chosen.into_iter().map(|(_, claim)| claim.expect("claimed")).collect())
}

/// `n` distinct loopback ports, each free when chosen, claimed by no live process, and outside
/// the kernel's ephemeral range, starting from a random place so that test processes running
/// side by side rarely pick the same ones. A port can still be taken by a process that does
/// not claim ports between this call and the server binding it: a server's first start should
/// choose again when it fails so.
///
/// Errors when fewer than `n` such ports are free.
pub fn free_loopback_ports(n: usize) -> io::Result<Vec<u16>> {
    choose(n, false).map(|chosen| chosen.into_iter().map(|(port, _)| port).collect())
}

fn choose(n: usize, claim: bool) -> io::Result<Vec<(u16, Option<PortClaim>)>> {
    let range = ephemeral_range();
    let candidates = outside_ephemeral(range).ok_or_else(|| {
        io::Error::other(format!("the ephemeral range {range:?} leaves no loopback ports outside it"))
    })?;
    let span = u32::from(*candidates.end()) - u32::from(*candidates.start()) + 1;
    let seed = u64::from(std::process::id()) ^ nanos_now();
    let first = *candidates.start() + SmallRng::seed_from_u64(seed).random_range(0..span) as u16;
    choose_from(candidates, first, n, claim)
}

/// `n` ports of `candidates` from `first` on (wrapping around), as [`choose`] says.
fn choose_from(
    candidates: RangeInclusive<u16>,
    first: u16,
    n: usize,
    claim: bool,
) -> io::Result<Vec<(u16, Option<PortClaim>)>> {
    let span = u32::from(*candidates.end()) - u32::from(*candidates.start()) + 1;
    let offset = u32::from(first - *candidates.start());
    // Held open until all are found, so that the ports differ.
    let mut held = Vec::with_capacity(n);
    for step in 0..span {
        if held.len() == n {
            break;
        }
        let port = (*candidates.start() as u32 + (offset + step) % span) as u16;
        if is_claimed(port) {
            continue;
        }
        let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) else { continue };
        let claimed = match claim {
            false => None,
            // Another process claimed it since `is_claimed` looked.
            true => match try_claim(port) {
                Some(claimed) => Some(claimed),
                None => continue,
            },
        };
        held.push((listener, port, claimed));
    }
    if held.len() < n {
        return Err(io::Error::other(format!(
            "only {} of {n} loopback ports in {candidates:?} are free",
            held.len()
        )));
    }
    Ok(held.into_iter().map(|(_, port, claim)| (port, claim)).collect())
}

/// Where the claims live, shared by every process on this machine that uses these helpers
/// (the Python tests' `slurm_cluster.py` reads it too). Claims their processes left behind
/// (a test process that exited with its shared server in a `static`, or died) are removed the
/// first time a process looks.
fn claims_dir() -> PathBuf {
    static SWEPT: Once = Once::new();
    let dir = std::env::temp_dir().join("rdzv-test-ports");
    SWEPT.call_once(|| {
        let _ = std::fs::create_dir_all(&dir);
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if !holder_lives(&entry.path()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    });
    dir
}

fn is_claimed(port: u16) -> bool {
    holder_lives(&claims_dir().join(port.to_string()))
}

/// Claims `port` unless a live process holds it; a claim whose process is gone is taken over.
fn try_claim(port: u16) -> Option<PortClaim> {
    let file = claims_dir().join(port.to_string());
    for _ in 0..2 {
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&file) {
            Ok(mut f) => {
                let _ = write!(f, "{}", std::process::id());
                return Some(PortClaim { port, file });
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && !holder_lives(&file) => {
                let _ = std::fs::remove_file(&file);
            }
            Err(_) => return None,
        }
    }
    None
}

/// Whether the process named in the claim `file` is alive. A claim without a process id yet
/// (its creator is writing it) counts as alive for a while.
fn holder_lives(file: &std::path::Path) -> bool {
    match std::fs::read_to_string(file) {
        Ok(text) => match text.trim().parse::<u32>() {
            Ok(pid) => std::path::Path::new(&format!("/proc/{pid}")).exists(),
            Err(_) => std::fs::metadata(file).and_then(|m| m.modified()).is_ok_and(|at| {
                SystemTime::now().duration_since(at).unwrap_or_default() < Duration::from_secs(10)
            }),
        },
        Err(_) => false,
    }
}

fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string(EPHEMERAL_RANGE_FILE)
        .ok()
        .and_then(|text| {
            let mut bounds = text.split_whitespace().map(str::parse::<u16>);
            Some((bounds.next()?.ok()?, bounds.next()?.ok()?))
        })
        .unwrap_or(DEFAULT_EPHEMERAL)
}

/// The larger of the spans below and above the ephemeral range, if either is not empty.
fn outside_ephemeral((low, high): (u16, u16)) -> Option<RangeInclusive<u16>> {
    let below = low.saturating_sub(LOWEST);
    let above = u16::MAX.saturating_sub(high);
    match below.max(above) {
        0 => None,
        _ if below >= above => Some(LOWEST..=low - 1),
        _ => Some(high + 1..=u16::MAX),
    }
}

fn nanos_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_outside_the_ephemeral_range() {
        let (low, high) = ephemeral_range();
        let ports = free_loopback_ports(6).expect("free ports");
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 6, "{ports:?}");
        assert!(ports.iter().all(|p| !(low..=high).contains(p)), "{ports:?} in {low}..={high}");
    }

    #[test]
    fn a_claimed_port_is_chosen_by_nobody_else_until_the_claim_is_dropped() {
        let claims = claim_loopback_ports(3).expect("claimed");
        let ports: Vec<u16> = claims.iter().map(PortClaim::port).collect();
        assert!(ports.iter().all(|&p| is_claimed(p)), "{ports:?}");
        // Free to bind, as a stopped server's ports are, but claimed: a choice that starts
        // at one of them passes over it.
        let candidates = outside_ephemeral(ephemeral_range()).expect("ports outside the range");
        for &port in &ports {
            let chosen = choose_from(candidates.clone(), port, 4, false).expect("free ports");
            assert!(chosen.iter().all(|(p, _)| !ports.contains(p)), "{chosen:?} has one of {ports:?}");
        }
        drop(claims);
        assert!(ports.iter().all(|&p| !is_claimed(p)), "{ports:?}");
    }

    #[test]
    fn a_claim_whose_process_is_gone_is_taken_over() {
        let mut child = std::process::Command::new("true").spawn().expect("true runs");
        let dead = child.id();
        child.wait().expect("true ends");
        // Claimed first, so that no test process beside this one chooses the port while the
        // claim is made over to the dead process (one free but unclaimed failed this test once
        // in a full run, likely so).
        let claim = claim_loopback_ports(1).expect("a free port").remove(0);
        let (port, file) = (claim.port, claim.file.clone());
        std::mem::forget(claim);
        std::fs::write(&file, dead.to_string()).expect("a claim written");
        assert!(!is_claimed(port));
        let claim = try_claim(port).expect("taken over");
        assert_eq!(std::fs::read_to_string(&file).expect("the claim"), std::process::id().to_string());
        drop(claim);
        assert!(!file.exists());
    }

    #[test]
    fn the_wider_side_of_the_ephemeral_range_is_used() {
        assert_eq!(outside_ephemeral((32768, 60999)), Some(10_000..=32767));
        assert_eq!(outside_ephemeral((1024, 40000)), Some(40001..=65535));
        assert_eq!(outside_ephemeral((0, 65535)), None);
    }
}
