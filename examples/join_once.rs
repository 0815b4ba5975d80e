//! One worker for the multi-process benchmark (`scripts/multiproc.py`): joins the run named
//! by the URL through `rdzv::connect`, completes one rendezvous, prints one JSON line
//! (rank, world size, round, phase timings, wall-clock end) and exits at once, without
//! leaving the round (like a worker that starts training; its lease expires on its own).
//!
//! With `RDZV_START_AT=<unix seconds>` it waits until that instant before it connects, so
//! that a launcher can start many processes at one common instant whatever its spawn speed.
//!
//! `cargo run --release --example join_once -- 'etcd://127.0.0.1:2379/job?min_workers=4&max_workers=4'`

use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let late = match std::env::var("RDZV_START_AT").ok().and_then(|v| v.parse::<f64>().ok()) {
        Some(at) => {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64();
            if at > now {
                tokio::time::sleep(std::time::Duration::from_secs_f64(at - now)).await;
            }
            (now - at).max(0.0)
        }
        None => 0.0,
    };
    let started = Instant::now();
    let Some(url) = std::env::args().nth(1) else {
        eprintln!(
            "usage: join_once <rendezvous url>, e.g. etcd://127.0.0.1:2379/job?min_workers=2&max_workers=2"
        );
        return ExitCode::from(2);
    };
    let worker = match rdzv::connect(&url).await {
        Ok(w) => w,
        Err(e) => {
            eprintln!("join_once: cannot join: {e}");
            return ExitCode::FAILURE;
        }
    };
    let connected = started.elapsed();
    match worker.next_rendezvous().await {
        Ok(round) => {
            let end = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
            println!(
                "{{\"rank\":{},\"world_size\":{},\"version\":{},\"connect_s\":{:.6},\"joined_s\":{:.6},\
                 \"frozen_s\":{:.6},\"completed_s\":{:.6},\"total_s\":{:.6},\"end_unix_s\":{:.6},\"late_s\":{:.6}}}",
                round.info.rank,
                round.info.world_size,
                round.info.version,
                connected.as_secs_f64(),
                round.info.timings.joined.as_secs_f64(),
                round.info.timings.frozen.as_secs_f64(),
                round.info.timings.completed.as_secs_f64(),
                started.elapsed().as_secs_f64(),
                end.as_secs_f64(),
                late,
            );
            // Exit without the runtime's orderly shutdown: the round is done, the rest is
            // the job's business (the session lease expires after its TTL).
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("join_once: rendezvous failed: {e}");
            ExitCode::FAILURE
        }
    }
}
