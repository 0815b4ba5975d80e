//! How results are printed: a round as one JSON line, `eval`-able shell assignments, or
//! text; participant tables; shell quoting.

use std::borrow::Cow;
use std::io::Write;
use std::time::Duration;

use rdzv::{Participant, Round};
use rdzv_core::RoundChanges;
use serde_json::json;

/// The output format of `join`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum JoinFormat {
    /// One JSON object per round, on one line.
    Json,
    /// `KEY=value` lines for `eval` in a shell.
    Env,
    /// For people.
    Text,
}

/// The output format of `status` and `bench`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    /// For people.
    Text,
    /// One JSON object.
    Json,
}

/// What `join` prints about a round it completed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoundView {
    /// The run.
    pub run_id: String,
    /// The round.
    pub version: u64,
    /// This worker's rank.
    pub rank: usize,
    /// The round's size.
    pub world_size: usize,
    /// The members in rank order.
    pub participants: Vec<Participant>,
    /// Rank 0's address.
    pub master_addr: String,
    /// A free port on rank 0's machine.
    pub master_port: u16,
    /// How long `next_rendezvous` took.
    pub elapsed: Duration,
    /// What changed since the round before, as this worker knew it.
    pub changes: RoundChanges,
}

/// Ranks as a comma-separated list (empty for none).
pub fn rank_list(ranks: &[usize]) -> String {
    ranks.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

impl RoundView {
    /// The view of `round`, which took `elapsed` to form.
    pub fn of(round: &Round, elapsed: Duration) -> RoundView {
        RoundView {
            run_id: round.info.run_id.clone(),
            version: round.info.version,
            rank: round.info.rank,
            world_size: round.info.world_size,
            participants: round.info.participants.to_vec(),
            master_addr: round.bootstrap.master_addr.clone(),
            master_port: round.bootstrap.master_port,
            elapsed,
            changes: round.info.changes.clone(),
        }
    }

    /// The round in `format`, ending with a newline.
    pub fn render(&self, format: JoinFormat) -> String {
        match format {
            JoinFormat::Json => format!("{}\n", self.json()),
            JoinFormat::Env => self.env(),
            JoinFormat::Text => self.text(),
        }
    }

    /// One line of JSON.
    pub fn json(&self) -> String {
        json!({
            "run_id": self.run_id,
            "version": self.version,
            "rank": self.rank,
            "world_size": self.world_size,
            "participants": self.participants.iter().map(participant_json).collect::<Vec<_>>(),
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "elapsed_ms": self.elapsed.as_millis() as u64,
            "previous_version": self.changes.previous_version,
            "previous_rank": self.changes.previous_rank,
            "left": self.changes.left,
            "joined": self.changes.joined,
        })
        .to_string()
    }

    /// `NAME=value` lines, values quoted for a POSIX shell.
    pub fn env(&self) -> String {
        let nodes: Vec<&str> = self.participants.iter().map(|p| p.node.as_str()).collect();
        env_lines(&[
            ("RDZV_RUN_ID", self.run_id.clone()),
            ("RDZV_VERSION", self.version.to_string()),
            ("RANK", self.rank.to_string()),
            ("WORLD_SIZE", self.world_size.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", self.master_port.to_string()),
            ("RDZV_PARTICIPANTS", nodes.join(",")),
            ("RDZV_ELAPSED_MS", (self.elapsed.as_millis() as u64).to_string()),
            ("RDZV_PREVIOUS_VERSION", self.changes.previous_version.map_or(String::new(), |v| v.to_string())),
            ("RDZV_PREVIOUS_RANK", self.changes.previous_rank.map_or(String::new(), |r| r.to_string())),
            ("RDZV_LEFT_RANKS", rank_list(&self.changes.left)),
            ("RDZV_JOINED_RANKS", rank_list(&self.changes.joined)),
        ])
    }

    /// A heading line, what changed since the round before (if there was one), and the
    /// member table.
    pub fn text(&self) -> String {
        let c = &self.changes;
        let changes = match c.previous_version {
            None => String::new(),
            Some(v) => {
                let was = c.previous_rank.map_or("not a member".to_string(), |r| format!("rank {r}"));
                let list =
                    |ranks: &[usize]| if ranks.is_empty() { "none".to_string() } else { rank_list(ranks) };
                format!(
                    "since round {v} (this worker: {was}): ranks left {}, joined {}\n",
                    list(&c.left),
                    list(&c.joined)
                )
            }
        };
        format!(
            "run {} round {}: rank {} of {} (master {}:{}), formed in {}\n{changes}{}",
            printable(&self.run_id),
            self.version,
            self.rank,
            self.world_size,
            printable(&self.master_addr),
            self.master_port,
            seconds(self.elapsed),
            participant_table(&self.participants, None, Some(self.rank)),
        )
    }
}

/// `text` safe to print on a terminal: control characters, line and paragraph separators,
/// and invisible formatting characters (bidirectional overrides, zero-width characters)
/// become `\u{…}` escapes, and a backslash becomes `\\` so that escapes cannot be
/// forged. Names and addresses read from the backend are written by any client of the run
/// and could otherwise move the cursor, clear the screen or disguise themselves.
pub fn printable(text: &str) -> Cow<'_, str> {
    fn needs_escape(c: char) -> bool {
        c == '\\'
            || c.is_control()
            || (c.is_whitespace() && c != ' ')
            || matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{206f}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}')
    }
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if needs_escape(c) => out.extend(c.escape_unicode()),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// A participant as JSON: `{"node", "addr", "pid"}`.
pub fn participant_json(p: &Participant) -> serde_json::Value {
    let mut v = json!({ "node": p.node, "addr": p.addr, "pid": p.pid });
    if let Some(segment) = &p.segment {
        v["segment"] = json!(segment);
    }
    v
}

/// `NAME=value` lines, values quoted for a POSIX shell.
pub fn env_lines(vars: &[(&str, String)]) -> String {
    vars.iter().map(|(name, value)| format!("{name}={}\n", shell_quote(value))).collect()
}

/// `value` as one word for a POSIX shell: unchanged if it holds only safe characters, else
/// in single quotes (a `'` inside becomes `'\''`).
pub fn shell_quote(value: &str) -> String {
    let safe = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ',' | ':' | '/' | '@' | '+'));
    if safe { value.to_string() } else { format!("'{}'", value.replace('\'', r"'\''")) }
}

/// A table of members in rank order: rank, node, address, pid, their segments when any has
/// one, and optionally whether each is alive; `me` marks this worker's row.
pub fn participant_table(participants: &[Participant], alive: Option<&[bool]>, me: Option<usize>) -> String {
    let mut header = vec!["rank", "node", "address", "pid"];
    let segments = participants.iter().any(|p| p.segment.is_some());
    if segments {
        header.push("segment");
    }
    if alive.is_some() {
        header.push("alive");
    }
    let rows: Vec<Vec<String>> = participants
        .iter()
        .enumerate()
        .map(|(rank, p)| {
            let mark = if me == Some(rank) { " *" } else { "" };
            let mut row = vec![
                format!("{rank}{mark}"),
                printable(&p.node).into_owned(),
                printable(&p.addr).into_owned(),
                p.pid.to_string(),
            ];
            if segments {
                row.push(printable(p.segment.as_deref().unwrap_or("-")).into_owned());
            }
            if let Some(alive) = alive {
                row.push(if alive.get(rank).copied().unwrap_or(false) { "yes" } else { "no" }.to_string());
            }
            row
        })
        .collect();
    table(&header, &rows)
}

/// Left-aligned columns, two spaces apart, indented by two; one line per row.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let text: Vec<String> = cells.zip(&widths).map(|(c, w)| format!("{c:<w$}", w = *w)).collect();
        format!("  {}\n", text.join("  ").trim_end())
    };
    let mut out = line(&mut header.iter().copied());
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

/// A duration as seconds with two decimals (`2.10 s`), or milliseconds below one second.
pub fn seconds(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

/// Prints `text` on stdout and flushes, so that a reader of a pipe sees it at once.
/// A closed stdout is not an error worth dying for: it is reported on stderr only via logs.
pub fn print_flush(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        tracing::warn!("cannot write to stdout: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> RoundView {
        RoundView {
            run_id: "job".into(),
            version: 3,
            rank: 1,
            world_size: 2,
            participants: vec![
                Participant { node: "a".into(), addr: "10.0.0.1".into(), pid: 11, port: None, segment: None },
                Participant {
                    node: "b x".into(),
                    addr: "10.0.0.2".into(),
                    pid: 22,
                    port: None,
                    segment: None,
                },
            ],
            master_addr: "10.0.0.1".into(),
            master_port: 29500,
            elapsed: Duration::from_millis(1234),
            changes: RoundChanges {
                previous_version: Some(2),
                previous_rank: None,
                left: vec![1].into(),
                joined: vec![1].into(),
            },
        }
    }

    #[test]
    fn json_is_one_line_with_the_documented_fields() {
        let line = view().render(JoinFormat::Json);
        assert_eq!(line.matches('\n').count(), 1);
        let v: serde_json::Value = serde_json::from_str(&line).expect("json");
        for field in [
            "run_id",
            "version",
            "rank",
            "world_size",
            "participants",
            "master_addr",
            "master_port",
            "elapsed_ms",
            "previous_version",
            "previous_rank",
            "left",
            "joined",
        ] {
            assert!(v.get(field).is_some(), "missing {field}");
        }
        assert_eq!(v["rank"], 1);
        assert_eq!(v["elapsed_ms"], 1234);
        assert_eq!(v["participants"][1]["node"], "b x");
        assert_eq!((v["previous_version"].clone(), v["previous_rank"].clone()), (json!(2), json!(null)));
        assert_eq!((v["left"].clone(), v["joined"].clone()), (json!([1]), json!([1])));
    }

    #[test]
    fn env_is_eval_safe() {
        let env = view().render(JoinFormat::Env);
        assert!(env.contains("RANK=1\n"), "{env}");
        assert!(env.contains("WORLD_SIZE=2\n"));
        assert!(env.contains("MASTER_PORT=29500\n"));
        assert!(env.contains("RDZV_PARTICIPANTS='a,b x'\n"), "{env}");
        assert!(env.contains("RDZV_PREVIOUS_VERSION=2\nRDZV_PREVIOUS_RANK=''\n"), "{env}");
        assert!(env.contains("RDZV_LEFT_RANKS=1\nRDZV_JOINED_RANKS=1\n"), "{env}");
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("abc-1.2"), "abc-1.2");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("it's $HOME"), r"'it'\''s $HOME'");
    }

    #[test]
    fn text_has_a_table() {
        let text = view().render(JoinFormat::Text);
        assert!(text.starts_with("run job round 3: rank 1 of 2"), "{text}");
        assert!(text.contains("since round 2 (this worker: not a member): ranks left 1, joined 1"), "{text}");
        assert!(text.contains("rank  node"), "{text}");
        assert!(text.contains("1 *"), "{text}");
        let with_alive = participant_table(&view().participants, Some(&[true, false]), None);
        assert!(with_alive.contains("alive"));
        assert!(with_alive.lines().nth(2).is_some_and(|l| l.ends_with("no")), "{with_alive}");
    }

    #[test]
    fn printable_escapes_what_a_terminal_would_act_on() {
        assert!(matches!(printable("host-1:29500"), Cow::Borrowed("host-1:29500")));
        assert_eq!(printable("a b.c_d@é"), "a b.c_d@é");
        assert_eq!(printable("x\u{1b}[2J"), "x\\u{1b}[2J");
        assert_eq!(printable("a\r\nb\tc"), "a\\u{d}\\u{a}b\\u{9}c");
        assert_eq!(printable("evil\u{202e}gpj.exe"), "evil\\u{202e}gpj.exe");
        assert_eq!(printable("zero\u{200b}width\u{2028}"), "zero\\u{200b}width\\u{2028}");
        assert_eq!(printable("\\u{1b}"), "\\\\u{1b}", "a literal escape stays distinguishable");
        assert_eq!(printable("\u{7f}\u{85}"), "\\u{7f}\\u{85}");
    }

    #[test]
    fn tables_escape_names_and_addresses() {
        let mut v = view();
        v.participants[0].node = "n\u{1b}]0;owned\u{7}".into();
        v.participants[1].addr = "10.0.0.2\nrank 9".into();
        v.master_addr = "m\r".into();
        let text = v.render(JoinFormat::Text);
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text:?}");
        assert_eq!(text.lines().count(), 5, "one heading, the changes, one header, two rows: {text}");
        assert!(text.contains("n\\u{1b}]0;owned\\u{7}"), "{text}");
        assert!(text.contains("10.0.0.2\\u{a}rank 9"), "{text}");
        // JSON keeps the real value (serde escapes it).
        let line = v.render(JoinFormat::Json);
        assert_eq!(line.lines().count(), 1);
        let parsed: serde_json::Value = serde_json::from_str(&line).expect("json");
        assert_eq!(parsed["participants"][1]["addr"], "10.0.0.2\nrank 9");
    }

    #[test]
    fn durations() {
        assert_eq!(seconds(Duration::from_millis(250)), "250 ms");
        assert_eq!(seconds(Duration::from_millis(2100)), "2.10 s");
    }
}
