//! `rdzv run --events FILE|-`: each event as one JSON line, appended to a file or written to
//! stderr, by a thread of its own — events are reported on rdzv's runtime threads, which must
//! never wait for a slow disk or a full pipe.

use std::io::Write;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use rdzv_core::events::Event;

use crate::exit::{CONFIG, CliError};

/// What the writer thread is asked to do.
enum Message {
    Line(String),
    /// Tell when every line before this one is written.
    Flush(mpsc::Sender<()>),
}

/// The writer of an event log.
pub struct EventLog {
    lines: mpsc::Sender<Message>,
}

impl EventLog {
    /// A log appending to `path` (created if missing), or writing to stderr for `-`.
    pub fn open(path: &Path) -> Result<EventLog, CliError> {
        let (out, name): (Box<dyn Write + Send>, String) = if path == Path::new("-") {
            (Box::new(std::io::stderr()), "stderr".into())
        } else {
            let file =
                std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| CliError {
                    code: CONFIG,
                    message: format!("cannot open the event log {} (--events): {e}", path.display()),
                })?;
            (Box::new(file), path.display().to_string())
        };
        let (lines, received) = mpsc::channel();
        std::thread::Builder::new()
            .name("rdzv-events".into())
            .spawn(move || write_lines(out, &name, received))
            .map_err(|e| CliError::other(format!("cannot start the event log's writer: {e}")))?;
        Ok(EventLog { lines })
    }

    /// A subscriber that logs each event (see `RendezvousHandler::on_event`): it only queues
    /// the line.
    pub fn subscriber(&self) -> impl Fn(&Event) + Send + Sync + 'static {
        let lines = self.lines.clone();
        move |event: &Event| {
            let _ = lines.send(Message::Line(event.json_line()));
        }
    }

    /// Waits until every event reported so far is written, for at most `within`.
    pub fn flush(&self, within: Duration) {
        let (done, written) = mpsc::channel();
        if self.lines.send(Message::Flush(done)).is_ok() {
            let _ = written.recv_timeout(within);
        }
    }
}

/// Writes each line as it comes, until every sender is gone. A write that fails is said once
/// on stderr; the lines after it are dropped (the agent carries on without its log).
fn write_lines(mut out: Box<dyn Write + Send>, name: &str, received: mpsc::Receiver<Message>) {
    let mut broken = false;
    for message in received {
        match message {
            Message::Line(line) if !broken => {
                let written = out
                    .write_all(line.as_bytes())
                    .and_then(|()| out.write_all(b"\n"))
                    .and_then(|()| out.flush());
                if let Err(e) = written {
                    eprintln!("rdzv: cannot write to the event log {name}: {e}; no more events are logged");
                    broken = true;
                }
            }
            Message::Line(_) => {}
            Message::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use rdzv_core::events::EventKind;

    use super::*;

    #[test]
    fn appends_one_line_per_event_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("events.jsonl");
        std::fs::write(&path, "earlier\n").expect("writes");
        let log = EventLog::open(&path).expect("opens");
        let subscriber = log.subscriber();
        for waiting in 0..3 {
            subscriber(&Event {
                time: SystemTime::UNIX_EPOCH,
                run_id: "r".into(),
                node: "n".into(),
                segment: None,
                kind: EventKind::NodesWaiting { waiting, spares: 0 },
            });
        }
        log.flush(Duration::from_secs(10));
        let text = std::fs::read_to_string(&path).expect("reads");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "earlier", "appended, not truncated");
        let waiting: Vec<u64> = lines[1..]
            .iter()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).expect("JSON")["waiting"].as_u64().expect("n")
            })
            .collect();
        assert_eq!(waiting, [0, 1, 2]);
    }

    #[test]
    fn a_log_that_cannot_be_opened_is_refused() {
        let e = EventLog::open(Path::new("/nonexistent/dir/events")).err().expect("refused");
        assert_eq!(e.code, CONFIG);
        assert!(e.message.contains("--events"), "{e:?}");
    }
}
