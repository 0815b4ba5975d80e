//! Network faults between a node and its servers, on loopback, for tests: a [`Link`] is a
//! set of TCP proxies (one per server endpoint) that a node connects through instead of the
//! servers themselves.
//!
//! - [`Link::freeze`] is a **partition**: no byte flows in either direction, yet every
//!   connection stays open and nothing is reset — as when packets vanish on the way and
//!   nothing answers. Bytes already sent wait, as they would in TCP's retransmission queue;
//!   new connections are not accepted (the client's connect completes in the kernel's
//!   backlog, then nothing answers). The node's own timers and keep-alives are what notice.
//! - [`Link::heal`] ends it: the held bytes flow on, in order, on the same connections,
//!   and waiting connections are accepted.
//! - [`Link::cut`] resets every open connection at once (RST), like a middlebox dropping
//!   its state; the link stays up for new connections.
//!
//! A link runs on a runtime of its own, so a busy or blocked test runtime cannot stall it,
//! and it can be used from synchronous code. The `rdzv-netfault` binary runs links as a
//! separate process, driven over stdin, for tests in other languages (docs/TESTING.md).
//!
//! ```
//! # fn main() -> std::io::Result<()> {
//! use std::io::{Read, Write};
//! let server = std::net::TcpListener::bind("127.0.0.1:0")?;
//! let link = rdzv_netfault::Link::start([server.local_addr()?])?;
//! let mut client = std::net::TcpStream::connect(link.endpoints()[0])?;
//! let (mut accepted, _) = server.accept()?;
//! link.freeze();
//! client.write_all(b"held")?; // accepted by the kernel, not delivered
//! accepted.set_read_timeout(Some(std::time::Duration::from_millis(200)))?;
//! assert!(accepted.read(&mut [0; 4]).is_err(), "nothing flows while frozen");
//! link.heal();
//! accepted.set_read_timeout(None)?;
//! let mut got = [0; 4];
//! accepted.read_exact(&mut got)?;
//! assert_eq!(&got, b"held"); // delivered after the heal, on the same connection
//! # Ok(())
//! # }
//! ```

mod link;
mod proxy;

pub use link::Link;
