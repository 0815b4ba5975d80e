//! `rdzv status --watch`: the run's snapshot, taken again each time something under the run's
//! keys changes — by watching them from the revision of the last snapshot, never by polling —
//! with the changes seen between snapshots. On a terminal the screen is cleared and redrawn;
//! otherwise each new snapshot is printed after the last (as text, or one JSON object per
//! line). Ends with exit 0 on SIGINT, SIGTERM, SIGHUP or SIGQUIT.

use std::collections::VecDeque;
use std::io::IsTerminal;
use std::time::{Duration, SystemTime};

use rdzv_core::KvError;
use rdzv_core::KvExt;
use rdzv_core::kv::WatchScope;
use rdzv_core::retry::RetryPolicy;

use crate::cmd::status::{Snapshot, snapshot};
use crate::exit::{CliError, UNAVAILABLE};
use crate::output::{ReportFormat, print_flush, printable};
use crate::signals::Signals;
use crate::target::RunTarget;

/// Changes come in bursts (a round forming writes several keys): one snapshot after the
/// burst, not one per key.
const SETTLE: Duration = Duration::from_millis(100);

/// The pauses before asking an unreachable backend again: 100 ms growing to 5 s.
const UNREACHABLE: RetryPolicy = RetryPolicy::new(Duration::from_millis(100), Duration::from_secs(5));

/// How many of the last changes the live view shows.
const LAST_CHANGES: usize = 10;

/// Clears the screen and puts the cursor at its top left (ANSI's ED 2 and CUP, understood by
/// every terminal emulator since the VT100: two fixed sequences need no terminal library).
const CLEAR: &str = "\x1b[H\x1b[2J";

/// Watches the run `target` names until a signal, printing in `format`.
pub async fn watch(target: &RunTarget, format: ReportFormat) -> Result<(), CliError> {
    let mut signals = Signals::catch().map_err(|e| CliError::other(format!("cannot catch signals: {e}")))?;
    let screen = format == ReportFormat::Text && std::io::stdout().is_terminal();
    watch_until(target, format, screen, async move {
        signals.recv().await;
    })
    .await
}

/// [`watch`] until `stop` resolves; `screen`: redraw a terminal.
async fn watch_until(
    target: &RunTarget,
    format: ReportFormat,
    screen: bool,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), CliError> {
    tokio::pin!(stop);
    let mut shown: Option<Snapshot> = None;
    let mut changes: VecDeque<String> = VecDeque::new();
    let mut delays = UNREACHABLE.pauses();
    loop {
        let now = tokio::select! {
            now = snapshot(target) => now,
            () = &mut stop => return Ok(()),
        };
        let now = match now {
            Ok(now) => now,
            Err(e) if e.code == UNAVAILABLE => {
                eprintln!("rdzv: {}; trying again", e.message);
                tokio::select! {
                    () = tokio::time::sleep(delays.next().unwrap_or(UNREACHABLE.longest)) => continue,
                    () = &mut stop => return Ok(()),
                }
            }
            Err(e) => return Err(e),
        };
        delays = UNREACHABLE.pauses();
        // Watched from this snapshot's revision, whether it is shown or the same as before.
        let revision = now.revision;
        if shown.as_ref().is_none_or(|before| before.json() != now.json()) {
            let new: Vec<String> = changes_between(shown.as_ref(), &now)
                .into_iter()
                .map(|change| format!("{} {change}", clock(SystemTime::now())))
                .collect();
            changes.extend(new.iter().cloned());
            while changes.len() > LAST_CHANGES {
                changes.pop_front();
            }
            print_flush(&render(&now, &changes, new.len(), format, screen));
            shown = Some(now);
        }
        tokio::select! {
            changed = next_change(target, revision) => match changed {
                Ok(()) => {}
                Err(e) if e.is_retryable() || e.needs_reread() => {
                    tracing::debug!("watching the run: {e}; reading it again");
                    tokio::select! {
                        () = tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(5))) => {}
                        () = &mut stop => return Ok(()),
                    }
                }
                Err(e) => return Err(rdzv::RendezvousError::from(e).into()),
            },
            () = &mut stop => return Ok(()),
        }
    }
}

/// Returns once a key under the run's prefix changed after `revision` (and the burst it came
/// in has settled).
async fn next_change(target: &RunTarget, revision: rdzv_core::kv::Revision) -> Result<(), KvError> {
    let mut watch =
        target.kv.watch_from(target.keys.root().as_bytes(), WatchScope::Prefix, revision + 1).await?;
    watch.next().await?;
    let settled = tokio::time::sleep(SETTLE);
    tokio::pin!(settled);
    loop {
        tokio::select! {
            () = &mut settled => return Ok(()),
            more = watch.next() => { more?; }
        }
    }
}

/// What `format` prints for `now`: the screen redrawn with the last `changes`, or the next
/// snapshot with the `new` changes that led to it (the last ones of `changes`).
fn render(
    now: &Snapshot,
    changes: &VecDeque<String>,
    new: usize,
    format: ReportFormat,
    screen: bool,
) -> String {
    match format {
        ReportFormat::Json => format!("{}\n", now.json()),
        ReportFormat::Text => {
            let mut out = String::new();
            if screen {
                out.push_str(CLEAR);
            } else {
                out.push_str(&format!("--- {}\n", humantime::format_rfc3339_seconds(SystemTime::now())));
            }
            out.push_str(&now.text());
            if screen {
                out.push_str("\nlast changes:\n");
                for change in changes {
                    out.push_str(&format!("  {change}\n"));
                }
                out.push_str("\n(watching; Ctrl-C to stop)\n");
            } else {
                for change in changes.iter().skip(changes.len().saturating_sub(new)) {
                    out.push_str(&format!("changed: {change}\n"));
                }
            }
            out
        }
    }
}

/// `HH:MM:SS` of `time`, UTC.
fn clock(time: SystemTime) -> String {
    let stamp = humantime::format_rfc3339_seconds(time).to_string();
    stamp.get(11..19).unwrap_or(&stamp).to_string()
}

/// What changed from `before` to `now`, in words (names passed through [`printable`]).
fn changes_between(before: Option<&Snapshot>, now: &Snapshot) -> Vec<String> {
    let Some(before) = before else {
        return vec!["watching".into()];
    };
    let mut said = Vec::new();
    if (before.version, &before.status) != (now.version, &now.status) {
        said.push(match (now.version, now.status.as_str()) {
            (Some(v), "final") => format!("round {v} formed: {} members", now.participants.len()),
            (Some(v), status) => format!("round {v} is {status}"),
            (None, "closed") => match &now.outcome {
                Some(outcome) => format!("run closed ({})", printable(outcome)),
                None => "run closed".into(),
            },
            (None, status) => format!("run is {}", printable(status)),
        });
    }
    if before.version == now.version {
        for (rank, ((p, was), (_, is))) in before.participants.iter().zip(&now.participants).enumerate() {
            if *was && !*is {
                said.push(format!("member {} (rank {rank}) lost", printable(&p.node)));
            }
        }
    }
    for node in now.waiting.iter().filter(|n| !before.waiting.contains(n)) {
        said.push(format!("{} waits", printable(node)));
    }
    for node in now.spares.iter().filter(|n| !before.spares.contains(n)) {
        said.push(format!("{} waits as a spare", printable(node)));
    }
    let was_excluded = |node: &str| before.excluded.iter().any(|e| e.node_id == node);
    for e in now.excluded.iter().filter(|e| !was_excluded(&e.node_id)) {
        said.push(format!("{} excluded: {}", printable(&e.node_id), printable(&e.reason)));
    }
    for e in before.excluded.iter().filter(|e| !now.excluded.iter().any(|n| n.node_id == e.node_id)) {
        said.push(format!("{} no longer excluded", printable(&e.node_id)));
    }
    said
}

#[cfg(test)]
mod tests {
    use rdzv::Participant;

    use super::*;

    fn p(node: &str) -> Participant {
        Participant { node: node.into(), addr: "h".into(), pid: 1, port: None, segment: None }
    }

    fn round(version: u64, alive: &[bool]) -> Snapshot {
        Snapshot {
            run_id: "job".into(),
            status: "final".into(),
            version: Some(version),
            participants: alive.iter().enumerate().map(|(i, a)| (p(&format!("n{i}")), *a)).collect(),
            ..Snapshot::default()
        }
    }

    /// Idle, the live view reads nothing (it waits on one watch); a change under the run's
    /// keys brings one new snapshot.
    #[tokio::test(start_paused = true)]
    async fn it_watches_and_never_polls() {
        use rdzv_core::Kv;
        use rdzv_core::kv::PutOptions;
        use rdzv_core::layer::CountingKv;

        let mut target = RunTarget::connect("mem://live-test/job").await.expect("memory");
        let counting = CountingKv::new(target.kv.clone());
        target.kv = counting.clone();
        let root = target.keys.root().to_string();
        let watching = tokio::spawn(async move {
            watch_until(&target, ReportFormat::Json, false, std::future::pending()).await
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        let settled = counting.snapshot();
        assert!(settled.reads() > 0 && settled.watches == 1, "{settled:?}");
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(counting.snapshot(), settled, "ten idle minutes cost nothing");
        // A Store key: the snapshot is the same, but it is taken again.
        Kv::put(&*counting, format!("{root}store/k").as_bytes(), b"v", PutOptions::OVERWRITE)
            .await
            .expect("put");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = counting.snapshot() - settled;
        assert!(after.reads() > 0 && after.watches == 1, "one snapshot and a new watch: {after:?}");
        watching.abort();
    }

    #[test]
    fn changes_are_told_in_words() {
        let first = round(1, &[true, true]);
        assert_eq!(changes_between(None, &first), ["watching"]);
        let mut spare = first.clone();
        spare.spares = vec!["s\u{1b}".into()];
        assert_eq!(changes_between(Some(&first), &spare), ["s\\u{1b} waits as a spare"]);
        let lost = round(1, &[true, false]);
        assert_eq!(changes_between(Some(&first), &lost), ["member n1 (rank 1) lost"]);
        let second = round(2, &[true, true]);
        assert_eq!(changes_between(Some(&lost), &second), ["round 2 formed: 2 members"]);
        let mut sick = second.clone();
        sick.excluded = vec![rdzv::Exclusion::new("n9", "h", "exit status 1", std::time::SystemTime::now())];
        assert_eq!(changes_between(Some(&second), &sick), ["n9 excluded: exit status 1"]);
        assert_eq!(changes_between(Some(&sick), &second), ["n9 no longer excluded"]);
        let closed = Snapshot {
            run_id: "job".into(),
            status: "closed".into(),
            outcome: Some("succeeded".into()),
            ..Snapshot::default()
        };
        assert_eq!(changes_between(Some(&second), &closed), ["run closed (succeeded)"]);
    }

    #[test]
    fn a_terminal_is_redrawn_and_a_pipe_gets_one_snapshot_after_another() {
        let now = round(1, &[true]);
        let changes =
            VecDeque::from(["12:00:00 watching".to_string(), "12:00:01 round 1 formed: 1 members".into()]);
        let screen = render(&now, &changes, 2, ReportFormat::Text, true);
        assert!(screen.starts_with(CLEAR) && screen.contains("round 1 is final"), "{screen}");
        assert!(screen.contains("last changes:\n  12:00:00 watching\n  12:00:01 round 1 formed"), "{screen}");
        let plain = render(&now, &changes, 1, ReportFormat::Text, false);
        assert!(!plain.contains('\u{1b}') && plain.starts_with("--- "), "{plain}");
        assert!(
            plain.ends_with("extra data keys: 0\nchanged: 12:00:01 round 1 formed: 1 members\n"),
            "{plain}"
        );
        let json = render(&now, &changes, 2, ReportFormat::Json, false);
        assert_eq!(json.lines().count(), 1);
        assert_eq!(serde_json::from_str::<serde_json::Value>(&json).expect("JSON"), now.json());
    }
}
