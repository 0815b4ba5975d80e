//! What a frozen, healed and cut link does to real TCP connections on loopback: the
//! properties docs/TESTING.md promises of the partition harness.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use rdzv_netfault::Link;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

/// Long enough for a byte to cross loopback many times over.
const QUIET: Duration = Duration::from_millis(300);
const T: Duration = Duration::from_secs(10);

async fn pair(server: &TcpListener, link: &Link) -> (TcpStream, TcpStream) {
    let client = TcpStream::connect(link.endpoints()[0]).await.unwrap();
    let (accepted, _) = timeout(T, server.accept()).await.unwrap().unwrap();
    (client, accepted)
}

/// Nothing arrives within `QUIET`, and the connection is neither closed nor reset.
async fn silent(stream: &mut TcpStream) {
    let mut byte = [0u8; 1];
    assert!(timeout(QUIET, stream.read(&mut byte)).await.is_err(), "a byte or an end came through");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_link_holds_bytes_both_ways_without_a_reset_and_delivers_them_healed() {
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let link = Link::start([server.local_addr().unwrap()]).unwrap();
    let (mut client, mut accepted) = pair(&server, &link).await;
    client.write_all(b"before").await.unwrap();
    let mut got = [0u8; 6];
    timeout(T, accepted.read_exact(&mut got)).await.unwrap().unwrap();
    assert_eq!(&got, b"before");
    assert_eq!(link.open_connections(), 1);

    link.freeze();
    assert!(link.is_frozen());
    client.write_all(b"up").await.unwrap();
    accepted.write_all(b"down").await.unwrap();
    silent(&mut accepted).await;
    silent(&mut client).await;
    // A new connection completes in the kernel's backlog, but is never answered.
    let mut late = TcpStream::connect(link.endpoints()[0]).await.unwrap();
    late.write_all(b"late").await.unwrap();
    assert!(timeout(QUIET, server.accept()).await.is_err(), "accepted while frozen");
    silent(&mut late).await;

    link.heal();
    let mut up = [0u8; 2];
    timeout(T, accepted.read_exact(&mut up)).await.unwrap().unwrap();
    assert_eq!(&up, b"up", "held bytes arrive on the same connection");
    let mut down = [0u8; 4];
    timeout(T, client.read_exact(&mut down)).await.unwrap().unwrap();
    assert_eq!(&down, b"down");
    let (mut late_accepted, _) = timeout(T, server.accept()).await.unwrap().unwrap();
    let mut got = [0u8; 4];
    timeout(T, late_accepted.read_exact(&mut got)).await.unwrap().unwrap();
    assert_eq!(&got, b"late", "the waiting connection is accepted once healed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_blocks_once_the_frozen_path_is_full_and_loses_nothing() {
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let link = Link::start([server.local_addr().unwrap()]).unwrap();
    let (mut client, accepted) = pair(&server, &link).await;
    link.freeze();
    // Far more than the socket buffers hold: the writer must stall, not fail.
    let total = 64 * 1024 * 1024;
    let writer = tokio::spawn(async move {
        let chunk = vec![7u8; 1 << 20];
        let mut sent = 0;
        while sent < total {
            client.write_all(&chunk).await.unwrap();
            sent += chunk.len();
        }
        client.shutdown().await.unwrap();
    });
    tokio::time::sleep(QUIET).await;
    assert!(!writer.is_finished(), "64 MiB went into a frozen link");
    link.heal();
    let mut received = 0usize;
    let mut reader = BufReader::new(accepted);
    loop {
        let buf = timeout(T, reader.fill_buf()).await.unwrap().unwrap();
        if buf.is_empty() {
            break;
        }
        assert!(buf.iter().all(|b| *b == 7));
        let n = buf.len();
        received += n;
        reader.consume(n);
    }
    assert_eq!(received, total, "every byte, then the end");
    timeout(T, writer).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_resets_open_connections_and_lets_new_ones_through() {
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let link = Link::start([server.local_addr().unwrap()]).unwrap();
    let (mut client, mut accepted) = pair(&server, &link).await;
    assert_eq!(link.cut(), 1);
    let mut byte = [0u8; 1];
    let err = timeout(T, client.read(&mut byte)).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    let err = timeout(T, accepted.read(&mut byte)).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    let (mut again, mut accepted) = pair(&server, &link).await;
    again.write_all(b"x").await.unwrap();
    timeout(T, accepted.read_exact(&mut byte)).await.unwrap().unwrap();
    assert_eq!(&byte, b"x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_link_freezes_all_its_endpoints_and_no_other_link() {
    let servers =
        [TcpListener::bind("127.0.0.1:0").await.unwrap(), TcpListener::bind("127.0.0.1:0").await.unwrap()];
    let targets = servers.iter().map(|s| s.local_addr().unwrap());
    let cut_off = Link::start(targets.clone()).unwrap();
    let other = Link::start(targets).unwrap();
    assert_eq!(cut_off.endpoint_list().matches("127.0.0.1:").count(), 2);
    cut_off.freeze();
    for (i, server) in servers.iter().enumerate() {
        let _frozen = TcpStream::connect(cut_off.endpoints()[i]).await.unwrap();
        assert!(timeout(QUIET, server.accept()).await.is_err(), "endpoint {i} of the frozen link");
        let _fine = TcpStream::connect(other.endpoints()[i]).await.unwrap();
        timeout(T, server.accept()).await.unwrap().unwrap();
    }
}

/// The binary: addresses on the first line, then one answer per command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_is_driven_over_stdin() {
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_rdzv-netfault"))
        .arg(server.local_addr().unwrap().to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = timeout(T, lines.next_line()).await.unwrap().unwrap().unwrap();
    let addr: std::net::SocketAddr = first.trim().parse().unwrap();
    let mut client = TcpStream::connect(addr).await.unwrap();
    let (mut accepted, _) = timeout(T, server.accept()).await.unwrap().unwrap();
    macro_rules! command {
        ($c:expr) => {{
            stdin.write_all(format!("{}\n", $c).as_bytes()).await.unwrap();
            timeout(T, lines.next_line()).await.unwrap().unwrap().unwrap()
        }};
    }
    assert_eq!(command!("freeze"), "ok");
    client.write_all(b"z").await.unwrap();
    silent(&mut accepted).await;
    assert_eq!(command!("heal"), "ok");
    let mut byte = [0u8; 1];
    timeout(T, accepted.read_exact(&mut byte)).await.unwrap().unwrap();
    assert_eq!(command!("cut"), "ok 1");
    assert!(command!("jump").starts_with("error: unknown command"));
    drop(stdin);
    let status = timeout(T, child.wait()).await.unwrap().unwrap();
    assert!(status.success());
}
