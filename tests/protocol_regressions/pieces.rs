//! A member list in pieces, deleted with its round, is no error to a member that reads of
//! that round late.

use super::*;

use rdzv_core::protocol::{Current, RunKeys};

/// Run `name`'s parameters with every member list in pieces: a member or two a piece.
fn in_pieces(name: &str, min: usize, max: usize) -> RendezvousParams {
    let mut p = params(&run_id(name), min, max);
    p.members_inline_bytes = 8;
    p
}

/// A member of round 1 told that a member died (not that the round ended) re-enters only
/// after rounds 2 to 4 formed without it: it yields first, watching the state from its
/// round's revision, and that history names round 2's member list, in pieces deleted with
/// round 2 since. The value was replaced, so the call passes it over and completes a round
/// with the other member (it used to fail with a `State` error: "0 of its pieces found").
#[test]
fn a_late_reentry_passes_over_rounds_whose_member_lists_are_gone() {
    paused(async {
        let kv = mem();
        let p = in_pieces("pieces-late", 1, 3);
        let ws = support::workers(&kv, &p, 3).await;
        let (other, late, dying) = (&ws[0].handler, &ws[1].handler, &ws[2]);
        let mut calls = Vec::new();
        for h in [other, late, &dying.handler] {
            let h = h.clone();
            calls.push(tokio::spawn(async move { h.next_rendezvous().await.unwrap() }));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut round_1 = Vec::new();
        for call in calls {
            round_1.push(call.await.unwrap());
        }
        assert_agreement(&round_1, 3, 3);
        assert_ne!(round_1[1].rank, 0, "the late member yields only with a rank above 0");
        dying.kill();
        let told = timeout(Duration::from_secs(10), late.round_broken()).await.unwrap();
        assert!(matches!(told, RoundBroken::MemberGone { .. }), "{told:?}");
        for version in 2..=4 {
            assert_eq!(other.next_rendezvous().await.unwrap().version, version);
        }
        // Round 4's creator deletes round 2 (it keeps round 3) once round 4 is final.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let round_2 = RunKeys::new(&p.prefix, &p.run_id).round(2);
        let left = kv.range(round_2.as_bytes(), Default::default()).await.unwrap().kvs;
        assert!(left.is_empty(), "round 2 is not deleted: {left:?}");
        let again = tokio::spawn({
            let late = late.clone();
            async move { late.next_rendezvous().await }
        });
        while other.num_nodes_waiting().await.unwrap() == 0 {
            assert!(!again.is_finished(), "{:?}", again.await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let round = other.next_rendezvous().await.unwrap();
        let rejoined = timeout(Duration::from_secs(10), again).await.unwrap().unwrap().unwrap();
        assert_eq!((rejoined.version, rejoined.world_size), (round.version, 2));
    });
}

/// A value that is still the state but whose member list is gone is a fault, said as one:
/// reading it fails with a `State` error naming the pieces, at once.
#[test]
fn a_state_whose_member_list_is_gone_reads_as_an_error() {
    paused(async {
        let kv = mem();
        let p = in_pieces("pieces-gone", 2, 2);
        let ws = support::workers(&kv, &p, 2).await;
        let handlers: Vec<_> = ws.iter().map(|w| w.handler.clone()).collect();
        let infos: Vec<_> =
            support::rendezvous_all(&handlers).await.into_iter().map(Result::unwrap).collect();
        assert_agreement(&infos, 2, 2);
        let keys = RunKeys::new(&p.prefix, &p.run_id);
        let pieces = format!("{}members/", keys.round(1));
        assert!(kv.delete_prefix(pieces.as_bytes()).await.unwrap().deleted > 0, "no pieces under {pieces}");
        let read = timeout(Duration::from_secs(1), Current::read(&*kv, &keys)).await.unwrap();
        assert!(
            matches!(&read, Err(RendezvousError::State { key, .. }) if key.starts_with(&pieces)),
            "{read:?}"
        );
    });
}
