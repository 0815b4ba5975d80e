//! A spare's deadline does not run behind a full round.

use super::*;

/// A spare waits as long as the round it waits behind is full and intact, whatever its
/// timeout; when a member leaves, the spare gets a whole timeout again to form the next round.
#[test]
fn a_spare_waits_without_a_deadline_then_gets_a_whole_timeout() {
    paused(async {
        let kv: Arc<dyn Kv> = Arc::new(MemKv::new());
        let (a, b) = (handler(kv.clone(), 2, 2, "a").await, handler(kv.clone(), 2, 2, "b").await);
        let (x, y) = tokio::join!(a.next_rendezvous(), b.next_rendezvous());
        let first = x.unwrap().version;
        assert_eq!(y.unwrap().version, first);
        let mut p = worker_params(2, 2, "spare");
        p.timeout = Duration::from_secs(3);
        let spare = RendezvousHandler::new(kv.clone(), p).await.unwrap();
        let pending = tokio::spawn(async move { spare.next_rendezvous().await });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!pending.is_finished(), "the spare's deadline ran behind a full round");
        // b leaves; a re-enters 2 s later (within the spare's fresh 3 s, beyond any old one).
        b.shutdown().await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let again = tokio::time::timeout(Duration::from_secs(5), a.next_rendezvous()).await.unwrap().unwrap();
        let promoted = tokio::time::timeout(Duration::from_secs(5), pending).await.unwrap().unwrap().unwrap();
        assert_eq!((again.version, again.rank), (promoted.version, 0), "a keeps its rank");
        assert_eq!(promoted.rank, 1);
        assert!(promoted.version > first);
    });
}
