//! `rdzv status`: the run as it is now, read straight from the backend.

use std::borrow::Cow;
use std::process::ExitCode;

use rdzv::Participant;
use rdzv_core::kv::{RangeOptions, Revision};
use rdzv_core::protocol::{Current, State};
use rdzv_core::{Exclusion, Kv, Waiting};
use serde_json::json;

use crate::exit::CliError;
use crate::output::{ReportFormat, participant_json, participant_table, print_flush, printable};
use crate::target::RunTarget;

const LONG_ABOUT: &str = "\
Shows the run as it is now: the state of the current round (setup, joinable, frozen, final,
closed, and how a closed run ended when its closer said so), its version, the members with
their liveness (whether their keep-alive key is still there), the workers that joined a
forming round, and, while a round runs, the workers waiting for the next one in the order it
would take them: those it could admit (waiting: as many as max_workers leaves room for beside
the live members; `num_nodes_waiting` counts these) and the spares beyond them, which only a
member's death or departure admits. Also the extra data keys of the round, and the nodes
their health check keeps out of the run (excluded: node, address, since when, and why; they
never count as waiting). Needs no min_workers in the URL; max_workers comes from the round
itself (or the URL's).

With --watch it stays, and shows the run again each time something under its keys changes
(it watches them; it does not poll): on a terminal the screen is redrawn, with the last
changes seen (rounds formed, members lost, nodes waiting, the run closed); otherwise each
new snapshot is printed after the last (with --format json, one JSON object per line). It
ends, with exit code 0, on Ctrl-C or SIGTERM.

Examples:
  rdzv status 'etcd://10.0.0.5:2379/job42'
  rdzv status \"$RDZV_URL\" --format json | jq .spares_count
  rdzv status \"$RDZV_URL\" --watch";

/// Arguments of `rdzv status`.
#[derive(Debug, clap::Args)]
#[command(about = "Show a run's state, members, waiting workers", long_about = LONG_ABOUT)]
pub struct StatusArgs {
    /// The rendezvous URL (min_workers is not needed; default: $RDZV_URL).
    #[arg(env = "RDZV_URL", hide_env_values = true, value_name = "URL")]
    url: String,
    /// How to print it.
    #[arg(long, value_enum, default_value = "text")]
    format: ReportFormat,
    /// Stay, and show the run again whenever it changes (until Ctrl-C).
    #[arg(long)]
    watch: bool,
}

/// What `status` found.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The run.
    pub run_id: String,
    /// The state's status name (`none` when there is no state).
    pub status: String,
    /// The round, if the state names one.
    pub version: Option<u64>,
    /// Members in rank order, with liveness.
    pub participants: Vec<(Participant, bool)>,
    /// How a closed run ended, if its closer said so (`succeeded`, `failed`).
    pub outcome: Option<String>,
    /// The round's `max_workers`, when known.
    pub max_workers: Option<usize>,
    /// Node ids of the joiners of a joinable round.
    pub joined: Vec<String>,
    /// Node ids of the workers the next round could admit, in the order it takes them.
    pub waiting: Vec<String>,
    /// Node ids of the spares: waiting workers beyond what the next round could admit, in
    /// the order they would be promoted.
    pub spares: Vec<String>,
    /// Extra data keys of the round.
    pub extra_data: Vec<String>,
    /// The nodes their health check keeps out, by node id.
    pub excluded: Vec<Exclusion>,
    /// The backend's revision when the state was read: every later change comes after it.
    pub revision: Revision,
}

/// Runs `rdzv status`.
pub async fn run(args: StatusArgs) -> Result<ExitCode, CliError> {
    let target = RunTarget::connect(&args.url).await?;
    if args.watch {
        crate::live::watch(&target, args.format).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let snapshot = snapshot(&target).await?;
    let text = match args.format {
        ReportFormat::Json => format!("{}\n", snapshot.json()),
        ReportFormat::Text => snapshot.text(),
    };
    print_flush(&text);
    Ok(ExitCode::SUCCESS)
}

/// Reads the run's state and the keys of its current round.
pub async fn snapshot(target: &RunTarget) -> Result<Snapshot, CliError> {
    let kv = &*target.kv;
    let keys = &target.keys;
    let read = Current::read(kv, keys).await?;
    let state = read.state().cloned();
    let mut snap = Snapshot {
        run_id: target.address.run_id.clone(),
        status: state.as_ref().map_or("none", State::status).to_string(),
        version: state.as_ref().and_then(State::version),
        revision: read.revision,
        ..Snapshot::default()
    };
    if let Some(State::Closed { outcome: Some(outcome) }) = &state {
        snap.outcome = Some(outcome.as_str().to_string());
    }
    snap.excluded = Exclusion::read_all(kv, keys).await?;
    let Some(version) = snap.version else { return Ok(snap) };
    if let Some(State::Frozen { participants, .. } | State::Final { participants, .. }) = &state {
        for (rank, p) in participants.iter().enumerate() {
            let alive =
                kv.get(&keys.rank(version, rank)).await.map_err(rdzv::RendezvousError::from)?.kv.is_some();
            snap.participants.push((p.clone(), alive));
        }
    }
    snap.joined = names_under(kv, &keys.joins(version)).await?;
    if let Some(State::Final { .. }) = &state {
        let option =
            |name: &str| target.address.url.rendezvous_options.get(name).and_then(|m| m.parse().ok());
        let waiting = Waiting::read(kv, keys, option("max_workers"), option("segment_size")).await?;
        let nodes =
            |ws: &[rdzv_core::protocol::Joiner]| ws.iter().map(|j| j.node.clone()).collect::<Vec<_>>();
        snap.max_workers = waiting.max_workers;
        snap.waiting = nodes(&waiting.waiters[..waiting.admissible]);
        snap.spares = nodes(waiting.spares());
    }
    snap.extra_data = names_under(kv, &keys.extra_data_prefix(version)).await?;
    Ok(snap)
}

/// The key names under `prefix`, without it.
async fn names_under(kv: &dyn Kv, prefix: &[u8]) -> Result<Vec<String>, CliError> {
    let options = RangeOptions { keys_only: true, ..RangeOptions::default() };
    let found = kv.range(prefix, options).await.map_err(rdzv::RendezvousError::from)?;
    Ok(found
        .kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key.strip_prefix(prefix).unwrap_or(&kv.key)).into_owned())
        .collect())
}

impl Snapshot {
    /// One JSON object.
    pub fn json(&self) -> serde_json::Value {
        json!({
            "run_id": self.run_id,
            "state": self.status,
            "outcome": self.outcome,
            "version": self.version,
            "max_workers": self.max_workers,
            "participants": self.participants.iter().enumerate().map(|(rank, (p, alive))| {
                let mut v = participant_json(p);
                v["rank"] = json!(rank);
                v["alive"] = json!(alive);
                v
            }).collect::<Vec<_>>(),
            "joined": self.joined,
            "joined_count": self.joined.len(),
            "waiting": self.waiting,
            "waiting_count": self.waiting.len(),
            "spares": self.spares,
            "spares_count": self.spares.len(),
            "extra_data": self.extra_data,
            "excluded": self.excluded,
            "excluded_count": self.excluded.len(),
        })
    }

    /// For people. Everything read from the backend (names, addresses, keys) is passed
    /// through [`printable`]: any client of the run could have written it.
    pub fn text(&self) -> String {
        let mut out = format!("run {}: ", printable(&self.run_id));
        match self.version {
            Some(v) => out.push_str(&format!("round {v} is {}\n", self.status)),
            None if self.status == "none" => {
                out.push_str("no round yet (nobody has joined, or the run expired)\n")
            }
            None if self.outcome.is_some() => out.push_str(&format!(
                "{} ({})\n",
                printable(&self.status),
                printable(self.outcome.as_deref().unwrap_or_default())
            )),
            None => out.push_str(&format!("{}\n", printable(&self.status))),
        }
        if !self.participants.is_empty() {
            let (members, alive): (Vec<Participant>, Vec<bool>) = self.participants.iter().cloned().unzip();
            let live = alive.iter().filter(|a| **a).count();
            let of_max = self.max_workers.map_or(String::new(), |max| format!(", max {max}"));
            out.push_str(&format!("members ({live} of {} alive{of_max}):\n", members.len()));
            out.push_str(&participant_table(&members, Some(&alive), None));
        }
        if self.status == "joinable" || !self.joined.is_empty() {
            out.push_str(&format!("joined: {}{}\n", self.joined.len(), list(&self.joined)));
        }
        out.push_str(&format!("waiting for the next round: {}{}\n", self.waiting.len(), list(&self.waiting)));
        if self.status == "final" {
            out.push_str(&format!("spares: {}{}\n", self.spares.len(), list(&self.spares)));
        }
        out.push_str(&format!("extra data keys: {}{}\n", self.extra_data.len(), list(&self.extra_data)));
        if !self.excluded.is_empty() {
            out.push_str(&format!("excluded by their health check: {}\n", self.excluded.len()));
            for e in &self.excluded {
                out.push_str(&format!(
                    "  {} ({}) since {}: {}\n",
                    printable(&e.node_id),
                    printable(&e.addr),
                    printable(&e.since),
                    printable(&e.reason)
                ));
            }
        }
        out
    }
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        return String::new();
    }
    let shown: Vec<Cow<'_, str>> = names.iter().map(|n| printable(n)).collect();
    format!(" ({})", shown.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_final_round_with_waiters() {
        let p = |n: &str| Participant { node: n.into(), addr: "h".into(), pid: 1, port: None, segment: None };
        let snap = Snapshot {
            run_id: "job".into(),
            status: "final".into(),
            version: Some(2),
            participants: vec![(p("a"), true), (p("b"), false)],
            max_workers: Some(2),
            waiting: vec!["c".into()],
            spares: vec!["d".into()],
            extra_data: vec!["x".into()],
            excluded: vec![Exclusion {
                node_id: "e".into(),
                addr: "h".into(),
                reason: "check `x`: exit status 1".into(),
                since: "2026-12-05T10:00:00Z".into(),
            }],
            ..Snapshot::default()
        };
        let text = snap.text();
        assert!(text.contains("round 2 is final"), "{text}");
        assert!(
            text.ends_with("excluded by their health check: 1\n  e (h) since 2026-12-05T10:00:00Z: check `x`: exit status 1\n"),
            "{text}"
        );
        assert!(text.contains("1 of 2 alive, max 2"), "{text}");
        assert!(text.contains("waiting for the next round: 1 (c)\nspares: 1 (d)\n"), "{text}");
        let v = snap.json();
        assert_eq!((v["waiting_count"].clone(), v["spares_count"].clone()), (json!(1), json!(1)));
        assert_eq!(v["spares"], json!(["d"]));
        assert_eq!(v["participants"][1]["alive"], false);
        assert_eq!(v["participants"][1]["rank"], 1);
        assert_eq!(v["excluded_count"], 1);
        assert_eq!(
            v["excluded"][0],
            json!({"node_id": "e", "addr": "h", "reason": "check `x`: exit status 1", "since": "2026-12-05T10:00:00Z"})
        );
    }

    #[test]
    fn text_escapes_what_other_clients_wrote() {
        let p = |n: &str, a: &str| Participant {
            node: n.into(),
            addr: a.into(),
            pid: 1,
            port: None,
            segment: None,
        };
        let snap = Snapshot {
            run_id: "job".into(),
            status: "final".into(),
            version: Some(2),
            participants: vec![(p("a\u{1b}[2J", "h\r\nmembers (9 of 9 alive):"), true)],
            waiting: vec!["w\u{7}".into(), "x\u{202e}y".into()],
            extra_data: vec!["k\ne".into()],
            ..Snapshot::default()
        };
        let text = snap.text();
        assert!(!text.chars().any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'), "{text:?}");
        assert!(text.contains("a\\u{1b}[2J"), "{text}");
        assert!(text.contains("h\\u{d}\\u{a}members (9 of 9 alive):"), "{text}");
        assert!(text.contains("(w\\u{7}, x\\u{202e}y)"), "{text}");
        assert!(text.contains("(k\\u{a}e)"), "{text}");
        assert_eq!(text.matches("alive):").count(), 2, "the fake heading stays inside its cell: {text}");
        assert_eq!(text.lines().count(), 7, "{text}");
        // JSON is escaped by serde and keeps the real values.
        let v = snap.json();
        assert_eq!(v["participants"][0]["node"], "a\u{1b}[2J");
        assert!(!v.to_string().contains('\u{1b}'));
    }

    #[test]
    fn renders_a_closed_run_with_its_outcome() {
        let snap = Snapshot {
            run_id: "job".into(),
            status: "closed".into(),
            outcome: Some("succeeded".into()),
            ..Snapshot::default()
        };
        assert!(snap.text().starts_with("run job: closed (succeeded)\n"), "{}", snap.text());
        assert_eq!(snap.json()["outcome"], "succeeded");
    }

    #[test]
    fn renders_no_run() {
        let snap = Snapshot { run_id: "job".into(), status: "none".into(), ..Snapshot::default() };
        assert!(snap.text().contains("no round yet"));
        assert_eq!(snap.json()["version"], serde_json::Value::Null);
    }
}
