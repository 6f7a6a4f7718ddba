//! Random sequences of single, bulk and burst operations checked against a `VecDeque` model,
//! for every mode combination, small capacities and counters starting anywhere (including just
//! before the `u32` wrap).
#![cfg(not(loom))]

use std::collections::VecDeque;

use mempool::ring::{Consumer, Hts, Multi, Producer, Ring, Rts, Single, SyncMode};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Enqueue(u32),
    EnqueueBulk(Vec<u32>),
    EnqueueBurst(Vec<u32>),
    Dequeue,
    DequeueBulk(usize),
    DequeueBurst(usize),
    /// Move to the next handle of each side (a no-op for Single sides); must not change behaviour.
    SwitchHandle,
}

fn op() -> impl Strategy<Value = Op> {
    let batch = || proptest::collection::vec(any::<u32>(), 0..20);
    prop_oneof![
        any::<u32>().prop_map(Op::Enqueue),
        batch().prop_map(Op::EnqueueBulk),
        batch().prop_map(Op::EnqueueBurst),
        Just(Op::Dequeue),
        (0usize..20).prop_map(Op::DequeueBulk),
        (0usize..20).prop_map(Op::DequeueBurst),
        Just(Op::SwitchHandle),
    ]
}

/// Runs `ops` against the model. `txs`/`rxs` are handles on the same ring: one for a Single
/// side, two clones for a Multi side (`SwitchHandle` rotates between them).
fn check<P: SyncMode, C: SyncMode>(
    capacity: usize,
    mut txs: Vec<Producer<u32, P>>,
    mut rxs: Vec<Consumer<u32, C>>,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let (mut at_tx, mut at_rx) = (0usize, 0usize);
    let mut model: VecDeque<u32> = VecDeque::new();
    let mut out = [0u32; 32];

    for op in ops {
        let (tx, rx) = (&mut txs[at_tx], &mut rxs[at_rx]);
        match op {
            Op::Enqueue(v) => {
                let r = tx.enqueue(*v);
                if model.len() < capacity {
                    prop_assert_eq!(r, Ok(()));
                    model.push_back(*v);
                } else {
                    prop_assert_eq!(r, Err(*v));
                }
            }
            Op::EnqueueBulk(vs) => {
                let n = tx.enqueue_bulk(vs);
                let fits = !vs.is_empty() && model.len() + vs.len() <= capacity;
                prop_assert_eq!(n, if fits { vs.len() } else { 0 });
                model.extend(&vs[..n]);
            }
            Op::EnqueueBurst(vs) => {
                let n = tx.enqueue_burst(vs);
                prop_assert_eq!(n, vs.len().min(capacity - model.len()));
                model.extend(&vs[..n]);
            }
            Op::Dequeue => {
                prop_assert_eq!(rx.dequeue(), model.pop_front());
            }
            Op::DequeueBulk(want) => {
                out.fill(u32::MAX);
                let n = rx.dequeue_bulk(&mut out[..*want]);
                let fits = *want != 0 && *want <= model.len();
                prop_assert_eq!(n, if fits { *want } else { 0 });
                let expected: Vec<u32> = model.drain(..n).collect();
                prop_assert_eq!(&out[..n], expected.as_slice());
                prop_assert!(
                    out[n..].iter().all(|&v| v == u32::MAX),
                    "wrote past the count"
                );
            }
            Op::DequeueBurst(want) => {
                let n = rx.dequeue_burst(&mut out[..*want]);
                prop_assert_eq!(n, (*want).min(model.len()));
                let expected: Vec<u32> = model.drain(..n).collect();
                prop_assert_eq!(&out[..n], expected.as_slice());
            }
            Op::SwitchHandle => {
                at_tx = (at_tx + 1) % txs.len();
                at_rx = (at_rx + 1) % rxs.len();
            }
        }
        let (tx, rx) = (&txs[at_tx], &rxs[at_rx]);
        prop_assert_eq!(rx.len(), model.len());
        prop_assert_eq!(rx.is_empty(), model.is_empty());
        prop_assert_eq!(tx.free_count(), capacity - model.len());
    }
    Ok(())
}

fn capacity() -> impl Strategy<Value = usize> {
    (0u32..=5).prop_map(|s| 1usize << s)
}

fn start() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), (u32::MAX - 64)..=u32::MAX, any::<u32>()]
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op(), 0..200)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn spsc_matches_model(cap in capacity(), start in start(), ops in ops()) {
        let (tx, rx) = Ring::with_capacity_and_start::<Single, Single>(cap, start).unwrap();
        check(cap, vec![tx], vec![rx], &ops)?;
    }

    #[test]
    fn mpsc_matches_model(cap in capacity(), start in start(), ops in ops()) {
        let (tx, rx) = Ring::with_capacity_and_start::<Multi, Single>(cap, start).unwrap();
        check(cap, vec![tx.clone(), tx], vec![rx], &ops)?;
    }

    #[test]
    fn spmc_matches_model(cap in capacity(), start in start(), ops in ops()) {
        let (tx, rx) = Ring::with_capacity_and_start::<Single, Multi>(cap, start).unwrap();
        check(cap, vec![tx], vec![rx.clone(), rx], &ops)?;
    }

    #[test]
    fn mpmc_matches_model(cap in capacity(), start in start(), ops in ops()) {
        let (tx, rx) = Ring::with_capacity_and_start::<Multi, Multi>(cap, start).unwrap();
        check(cap, vec![tx.clone(), tx], vec![rx.clone(), rx], &ops)?;
    }

    #[test]
    fn rts_matches_model(cap in capacity(), start in start(), ops in ops()) {
        let (tx, rx) = Ring::with_capacity_and_start::<Rts, Rts>(cap, start).unwrap();
        check(cap, vec![tx.clone(), tx], vec![rx.clone(), rx], &ops)?;
    }

    #[test]
    fn hts_matches_model(cap in capacity(), start in start(), ops in ops()) {
        let (tx, rx) = Ring::with_capacity_and_start::<Hts, Hts>(cap, start).unwrap();
        check(cap, vec![tx.clone(), tx], vec![rx.clone(), rx], &ops)?;
    }

    #[test]
    fn mixed_modes_match_model(cap in capacity(), start in start(), ops in ops()) {
        let (tx, rx) = Ring::with_capacity_and_start::<Hts, Rts>(cap, start).unwrap();
        check(cap, vec![tx.clone(), tx], vec![rx.clone(), rx], &ops)?;
        let (tx, rx) = Ring::with_capacity_and_start::<Rts, Single>(cap, start).unwrap();
        check(cap, vec![tx.clone(), tx], vec![rx], &ops)?;
    }
}
