//! The counts kept with the index agree with its entries.

use super::*;

#[test]
fn counts_tell_each_state_apart() {
    let mut ix = Index::default();
    let line = |op: &str, id: &str| {
        format!(r#"{{"op":"{op}","id":"{id}","epoch":1,"by":"w","at_ms":10}}"#) + "\n"
    };
    for (op, id) in [("take", "a"), ("take", "b"), ("take", "c"), ("done", "b")] {
        ix.extend(line(op, id).as_bytes());
    }
    ix.extend(line("give_back", "c").as_bytes());
    ix.extend(line("done", "d").as_bytes());
    let c = ix.counts();
    assert_eq!((c.taken, c.done, c.given_back), (1, 2, 1));
}

/// The counts kept with the entries equal a count of them after every
/// apply, expiry and shed (a pseudo-random run over few ids, so that
/// every transition happens).
#[test]
fn kept_counts_equal_a_recount_through_applies_expiries_and_sheds() {
    let recount = |ix: &Index| ix.recount();
    let (mut ix, mut x) = (Index::default(), 7u64);
    for at_ms in 1..3000u64 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let (id, epoch) = (format!("e{}", (x >> 33) % 40), (x >> 20) % 3 + 1);
        let op = match (x >> 40) % 4 {
            0 | 1 => Op::Take {
                id,
                epoch,
                by: "w".into(),
                at_ms,
                live: None,
                pub_ms: None,
            },
            2 => Op::Done {
                id,
                epoch,
                at_ms,
                pub_ms: None,
            },
            _ => Op::GiveBack { id, epoch, at_ms },
        };
        ix.apply(&op);
        if at_ms % 97 == 0 {
            ix.expire(at_ms, Duration::from_millis(200));
        }
        if at_ms % 131 == 0 {
            ix.forget_oldest_to(600);
        }
        if at_ms % 173 == 0 {
            ix.settle_to(600, at_ms / 2, ("w", 1, at_ms));
        }
        assert_eq!(ix.counts(), recount(&ix), "after {op:?}");
    }
    let c = ix.counts();
    assert!(c.taken > 0 && c.done > 0 && c.given_back > 0, "{c:?}");
}
