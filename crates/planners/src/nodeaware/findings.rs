//! Reproduces [Lockhart-2023]'s modelled findings (§4.6, Figure 4.3): which strategy the
//! models choose for 32 vs 256 inter-node messages, sent to 4 vs 16 destination nodes, across
//! message sizes, on Lassen (4 GPUs, 2 sockets, 40 processes per node).
//!
//! The figure is not in the text of the paper used here, only its prose; each test quotes the
//! sentence it checks. Where the reconstruction of the lost equations departs from the prose, the
//! test says so and asserts what the prose supports.

use super::*;

const SIZES_BYTES: [u64; 14] = [
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262_144,
    1 << 20,
    1 << 22,
    1 << 24,
    1 << 26,
];

fn winners(messages: u32, nodes: u32) -> Vec<(u64, Strategy, Staging)> {
    let shape = ClusterCounts::lassen(nodes + 1);
    SIZES_BYTES
        .iter()
        .map(|&b| {
            let p = Pattern::seed_scenario(&shape, messages, nodes, b);
            let (s, st, t) = choose_strategy(&p, &shape, MessageCostModel::MaxRate);
            assert!(t.is_finite() && t > 0.0);
            (b, s, st)
        })
        .collect()
}

/// Under either cost model, each strategy's modelled time never falls as the messages grow
/// (the curves of Figure 4.3 of [Lockhart-2023] rise with size), is finite and positive where the strategy
/// supports the staging, and the chosen strategy's time is the least of them: the figure's
/// circled minima are read off curves of this shape.
#[test]
fn modelled_times_rise_with_size_and_the_choice_is_their_minimum() {
    for (m, d) in [(32, 4), (32, 16), (256, 4), (256, 16)] {
        let shape = ClusterCounts::lassen(d + 1);
        for model in [MessageCostModel::Postal, MessageCostModel::MaxRate] {
            let mut last: Vec<f64> = vec![0.0; Strategy::combinations().len()];
            for b in SIZES_BYTES {
                let p = Pattern::seed_scenario(&shape, m, d, b);
                let times: Vec<f64> = Strategy::combinations()
                    .into_iter()
                    .map(|(s, st)| model_time(s, st, &p, &shape, model))
                    .collect();
                for (i, (s, st)) in Strategy::combinations().into_iter().enumerate() {
                    let what = format!("{m} msgs, {d} nodes, {b} B, {s} {st} {model:?}");
                    assert!(
                        times[i].is_finite() && times[i] > 0.0,
                        "{what}: {}",
                        times[i]
                    );
                    assert!(
                        times[i] >= last[i],
                        "{what}: {} after {}",
                        times[i],
                        last[i]
                    );
                }
                let (s, st, t) = choose_strategy(&p, &shape, model);
                let least = times.iter().copied().fold(f64::INFINITY, f64::min);
                assert_eq!(t, least, "{m} msgs, {d} nodes, {b} B: chose {s} {st}");
                last = times;
            }
        }
    }
}

/// "Staged-through-host node-aware communication techniques model the best performance
/// independent of number of destination nodes for all message sizes up to [a size the stored
/// text lost] Bytes."
#[test]
fn staged_node_aware_wins_small_messages() {
    for (m, d) in [(32, 4), (32, 16), (256, 4), (256, 16)] {
        for (b, s, st) in winners(m, d) {
            if b <= 4096 {
                assert_eq!(st, Staging::Host, "{m} msgs, {d} nodes, {b} B: {s} {st}");
                assert_ne!(s, Strategy::Standard, "{m} msgs, {d} nodes, {b} B");
            }
        }
    }
}

/// "[...] Split+MD communication is predicted to be the most performant when communicating with
/// a larger number of nodes (Figure 3(b))", because "each individual process is injecting fewer
/// messages into the network than in the case of 3-Step or 2-Step communication".
#[test]
fn split_md_wins_for_sixteen_nodes() {
    for m in [32, 256] {
        for (b, s, st) in winners(m, 16) {
            if (256..=1024).contains(&b) {
                assert_eq!(
                    (s, st),
                    (Strategy::SplitMd, Staging::Host),
                    "{m} msgs, {b} B"
                );
            }
        }
    }
}

/// "When communicating with a small number of nodes (Figure 3(a)), 3-Step and 2-Step
/// communication are often predicted to be the most performant". Our reconstruction also picks
/// Split+MD for the smallest messages to 4 nodes (the text of [Lockhart-2023, Eq. 4.2] is lost; see
/// the module docs of `model`), so this asserts that 2-Step or 3-Step wins some of the sizes the
/// staged strategies win, and that Split+MD is not chosen there once messages reach 16 KiB.
#[test]
fn multistep_wins_some_sizes_for_four_nodes() {
    for m in [32, 256] {
        let w = winners(m, 4);
        let multistep = w.iter().any(|(_, s, st)| {
            *st == Staging::Host && matches!(s, Strategy::TwoStep | Strategy::ThreeStep)
        });
        assert!(multistep, "{m} msgs: {w:?}");
        assert!(
            w.iter()
                .filter(|(b, ..)| *b >= 16384)
                .all(|(_, s, _)| *s != Strategy::SplitMd)
        );
    }
}

/// "In both cases, the staged-through-host strategies predict the best performance until
/// message sizes grow extremely large, where standard device-aware communication is modeled to
/// be best" (32 inter-node messages).
#[test]
fn standard_device_aware_wins_huge_messages_when_few() {
    for d in [4, 16] {
        for (b, s, st) in winners(32, d) {
            if b >= 1 << 20 {
                assert_eq!(
                    (s, st),
                    (Strategy::Standard, Staging::DeviceAware),
                    "{d}, {b}"
                );
            }
        }
    }
}

/// "Device-aware communication is also modeled to be best for large message sizes when a node
/// is injecting a large number of messages into the network. However, due to the high message
/// volume, 3-Step and 2-Step device-aware strategies are predicted to have the optimal
/// performance, due to their reduction in messages sent compared to standard communication."
#[test]
fn multistep_device_aware_wins_large_messages_when_many() {
    for d in [4, 16] {
        for (b, s, st) in winners(256, d) {
            if (65536..=262_144).contains(&b) {
                assert_eq!(st, Staging::DeviceAware, "{d} nodes, {b} B");
                assert!(matches!(s, Strategy::TwoStep | Strategy::ThreeStep), "{s}");
            }
        }
        // And both beat standard device-aware at every size up to 64 KiB (beyond it 3-Step
        // pays its redistribution of the large aggregated messages).
        let shape = ClusterCounts::lassen(d + 1);
        for b in SIZES_BYTES.iter().copied().filter(|b| *b <= 65536) {
            let p = Pattern::seed_scenario(&shape, 256, d, b);
            let t = |s| {
                model_time(
                    s,
                    Staging::DeviceAware,
                    &p,
                    &shape,
                    MessageCostModel::MaxRate,
                )
            };
            assert!(t(Strategy::ThreeStep) < t(Strategy::Standard), "{d}, {b}");
            assert!(t(Strategy::TwoStep) < t(Strategy::Standard), "{d}, {b}");
        }
    }
}

/// "'Split + DD' consistently performed worse than 'Split + MD', consistent with modeled
/// predictions" (§5.1).
#[test]
fn split_dd_never_beats_split_md() {
    for (m, d) in [(32, 4), (32, 16), (256, 4), (256, 16)] {
        let shape = ClusterCounts::lassen(d + 1);
        for b in SIZES_BYTES {
            let p = Pattern::seed_scenario(&shape, m, d, b);
            for model in [MessageCostModel::Postal, MessageCostModel::MaxRate] {
                let md = model_time(Strategy::SplitMd, Staging::Host, &p, &shape, model);
                let dd = model_time(Strategy::SplitDd, Staging::Host, &p, &shape, model);
                assert!(md <= dd, "{m} msgs, {d} nodes, {b} B: {md} > {dd}");
            }
        }
    }
}

#[test]
fn max_rate_only_adds_the_injection_limit() {
    let shape = ClusterCounts::lassen(5);
    let p = Pattern::seed_scenario(&shape, 256, 4, 1 << 20);
    for (s, st) in Strategy::combinations() {
        let postal = model_time(s, st, &p, &shape, MessageCostModel::Postal);
        let max_rate = model_time(s, st, &p, &shape, MessageCostModel::MaxRate);
        assert!(max_rate >= postal, "{s} {st}");
        if st == Staging::DeviceAware {
            assert_eq!(max_rate, postal);
        }
    }
    // Unsupported pairs and empty patterns.
    let t = model_time(
        Strategy::SplitMd,
        Staging::DeviceAware,
        &p,
        &shape,
        MessageCostModel::MaxRate,
    );
    assert!(t.is_infinite());
    let empty = Pattern::default();
    assert_eq!(
        model_time(
            Strategy::Standard,
            Staging::Host,
            &empty,
            &shape,
            MessageCostModel::Postal
        ),
        0.0
    );
}
