//! Loopback ports for test servers that are stopped and started again on the same ports.
//!
//! A port the kernel hands out for `bind(0)` lies in its ephemeral range, the range it also
//! draws the local port of every outgoing connection from. While a test server is down
//! (killed for an outage test), a client connecting anywhere can be given that very port,
//! and the restarted server then fails with "address already in use". Ports chosen below
//! (or above) the ephemeral range are never handed out that way.

use std::io;
use std::net::TcpListener;
use std::ops::RangeInclusive;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Where Linux keeps its ephemeral range; its default when the file cannot be read.
const EPHEMERAL_RANGE_FILE: &str = "/proc/sys/net/ipv4/ip_local_port_range";
const DEFAULT_EPHEMERAL: (u16, u16) = (32768, 60999);
/// Below this, ports are commonly taken by system services.
const LOWEST: u16 = 10_000;

/// `n` distinct loopback ports, each free when chosen and outside the kernel's ephemeral
/// range, starting from a random place so that test processes running side by side rarely
/// pick the same ones. A port can still be taken by another process between this call and
/// the server binding it: a server's first start should choose again when it fails so.
///
/// Errors when fewer than `n` such ports are free.
pub fn free_loopback_ports(n: usize) -> io::Result<Vec<u16>> {
    let range = ephemeral_range();
    let candidates = outside_ephemeral(range).ok_or_else(|| {
        io::Error::other(format!("the ephemeral range {range:?} leaves no loopback ports outside it"))
    })?;
    let span = u32::from(*candidates.end()) - u32::from(*candidates.start()) + 1;
    let seed = u64::from(std::process::id()) ^ nanos_now();
    let offset = SmallRng::seed_from_u64(seed).random_range(0..span);
    // Held open until all are found, so that the ports differ.
    let mut held = Vec::with_capacity(n);
    for step in 0..span {
        if held.len() == n {
            break;
        }
        let port = *candidates.start() as u32 + (offset + step) % span;
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port as u16)) {
            held.push(listener);
        }
    }
    if held.len() < n {
        return Err(io::Error::other(format!(
            "only {} of {n} loopback ports in {candidates:?} are free",
            held.len()
        )));
    }
    held.iter().map(|l| l.local_addr().map(|a| a.port())).collect()
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
    fn the_wider_side_of_the_ephemeral_range_is_used() {
        assert_eq!(outside_ephemeral((32768, 60999)), Some(10_000..=32767));
        assert_eq!(outside_ephemeral((1024, 40000)), Some(40001..=65535));
        assert_eq!(outside_ephemeral((0, 65535)), None);
    }
}
