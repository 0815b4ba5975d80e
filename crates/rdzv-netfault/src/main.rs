//! `rdzv-netfault TARGET…`: a [`Link`](rdzv_netfault::Link) as a process, for tests in other
//! languages (the Python tests). It prints the proxies' addresses on one line, in the
//! targets' order, then reads commands from stdin, one per line — `freeze`, `heal`, `cut` —
//! and answers each with a line `ok` (for `cut`: `ok <connections reset>`). It exits when
//! stdin closes, closing every connection.

use std::io::{BufRead, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;

const USAGE: &str = "usage: rdzv-netfault HOST:PORT [HOST:PORT…]  (then freeze / heal / cut on stdin)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || args.iter().any(|a| a.starts_with('-')) {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    }
    let mut targets: Vec<SocketAddr> = Vec::new();
    for arg in &args {
        match arg.to_socket_addrs().ok().and_then(|mut addrs| addrs.next()) {
            Some(addr) => targets.push(addr),
            None => {
                eprintln!("rdzv-netfault: `{arg}` is not HOST:PORT; {USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let link = match rdzv_netfault::Link::start(targets) {
        Ok(link) => link,
        Err(e) => {
            eprintln!("rdzv-netfault: cannot listen: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    let shown: Vec<String> = link.endpoints().iter().map(SocketAddr::to_string).collect();
    if writeln!(out, "{}", shown.join(" ")).and_then(|()| out.flush()).is_err() {
        return ExitCode::FAILURE;
    }
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let answer = match line.trim() {
            "freeze" => {
                link.freeze();
                "ok".to_string()
            }
            "heal" => {
                link.heal();
                "ok".to_string()
            }
            "cut" => format!("ok {}", link.cut()),
            "" => continue,
            other => format!("error: unknown command `{other}` (freeze, heal, cut)"),
        };
        if writeln!(out, "{answer}").and_then(|()| out.flush()).is_err() {
            break;
        }
    }
    ExitCode::SUCCESS
}
