//! A round whose member list is larger than the backend's largest request completes: the
//! `frozen` and `final` values name pieces of the list instead of holding it
//! (docs/PROTOCOL.md "How large a round can be"). On a real etcd whose
//! `--max-request-bytes` is 256 KiB, 1,200 workers with node ids of 240 characters make a
//! list of about 330 KB, which no single write could carry.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use rdzv_core::protocol::State;
use rdzv_core::testing::rendezvous as support;
use rdzv_core::{Kv, RendezvousHandler};
use rdzv_etcd::testing::EtcdServer;

const SERVER_LIMIT: usize = 256 * 1024;
const WORKERS: usize = 1200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_list_larger_than_a_request_goes_to_pieces_on_etcd() {
    let server =
        EtcdServer::builder().arg(format!("--max-request-bytes={SERVER_LIMIT}")).start().await.unwrap();
    let kv: Arc<dyn Kv> = Arc::new(server.try_kv().await.unwrap().with_max_request_bytes(SERVER_LIMIT));
    let mut params = support::params(&support::run_id("large"), WORKERS, WORKERS);
    params.timeout = Duration::from_secs(120);
    // The default TTL, not the tests' 3 s, with which a stall of 2 s of this debug-built
    // process of 1,200 sessions (beside the whole suite on two cores) loses sessions and makes
    // the round form again: it once did not complete in 120 s in CI. This test is about the
    // member list's pieces, not how fast a stalled member is noticed.
    params.keep_alive_ttl = Duration::from_secs(10);
    params.members_inline_bytes = 64 * 1024;
    let mut handlers = Vec::with_capacity(WORKERS);
    for i in 0..WORKERS {
        let mut p = params.clone();
        p.node_id = Some(format!("{i:0>240}"));
        handlers.push(RendezvousHandler::new(kv.clone(), p).await.unwrap());
    }
    let infos: Vec<_> = support::rendezvous_all(&handlers).await.into_iter().map(Result::unwrap).collect();
    support::assert_agreement(&infos, WORKERS, WORKERS);
    let ranks: BTreeSet<usize> = infos.iter().map(|i| i.rank).collect();
    assert_eq!(ranks.len(), WORKERS);

    // The state value names pieces, each under the server's limit; written whole, the
    // list would not fit in one request.
    let keys = handlers[0].keys().clone();
    let found = kv.get(&keys.state()).await.unwrap().kv.unwrap();
    assert!(State::names_pieces(&found.value), "{:?}", String::from_utf8_lossy(&found.value));
    let state = State::read(&*kv, &keys, &found).await.unwrap();
    let State::Final { participants, .. } = &state else { panic!("{state:?}") };
    assert_eq!(participants.len(), WORKERS);
    assert!(state.to_bytes().len() > SERVER_LIMIT, "{} bytes", state.to_bytes().len());
    let pieces = kv.range(keys.round(infos[0].version).as_bytes(), Default::default()).await.unwrap();
    let pieces: Vec<_> =
        pieces.kvs.iter().filter(|kv| kv.key.windows(9).any(|w| w == b"/members/")).collect();
    assert!(pieces.len() >= 5, "{} pieces", pieces.len());
    assert!(pieces.iter().all(|p| p.value.len() <= 64 * 1024));
    for h in &handlers {
        h.shutdown().await.unwrap();
    }
}
