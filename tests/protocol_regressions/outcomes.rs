//! A run's outcome, as its close says.

use super::*;
use rdzv_core::RunOutcome;

/// Issue 39, defect 2: under torchrun a faster node closes the run as succeeded while a
/// slower node's workers still run; should they fail, the job failed. `Failed` replaces
/// `Succeeded`, and nothing replaces `Failed`.
#[test]
fn failed_replaces_succeeded_and_is_final() {
    paused(async {
        let kv = mem();
        let (a, b) = (handler(kv.clone(), 1, 2, "a").await, handler(kv.clone(), 1, 2, "b").await);
        assert_eq!(a.run_outcome().await.unwrap(), None, "an open run has no outcome");
        a.set_closed_with(RunOutcome::Succeeded).await.unwrap();
        assert_eq!(b.run_outcome().await.unwrap(), Some(RunOutcome::Succeeded));
        b.set_closed_with(RunOutcome::Failed).await.unwrap();
        assert_eq!(a.run_outcome().await.unwrap(), Some(RunOutcome::Failed));
        a.set_closed_with(RunOutcome::Succeeded).await.unwrap();
        a.set_closed().await.unwrap();
        assert_eq!(b.run_outcome().await.unwrap(), Some(RunOutcome::Failed));
        assert!(matches!(
            b.next_rendezvous().await,
            Err(RendezvousError::Closed { outcome: Some(RunOutcome::Failed), .. })
        ));
    });
}
