//! Host-shift symmetry on the cluster presets: the period each fabric has and why, and the
//! properties every symmetry must keep (bijections onto equal links, round trips, orbit sums).

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;
use crate::{Mask, preset};

/// Check everything a symmetry promises, on every node, link and GPU of `t`.
fn check_laws(t: &Topology, s: &HostSymmetry) {
    let g = t.graph();
    assert_eq!(s.hosts(), t.host_count(), "{}", t.name());
    assert_eq!(s.hosts() % s.period(), 0, "{}", t.name());
    assert_eq!(s.periods() * s.period(), s.hosts());
    // A shift by one period that is a bijection makes every power one; the others are spot
    // checks of the wrap-around.
    let mut ks = vec![0, 1, 2, s.periods() - 1, s.periods(), s.periods() + 1];
    ks.sort_unstable();
    ks.dedup();
    for k in ks {
        // Nodes: a bijection that keeps kinds, data and mask verdicts.
        let images: BTreeSet<NodeId> = g.node_indices().map(|n| s.shift_node(n, k)).collect();
        assert_eq!(images.len(), g.node_count(), "{} shift {k}", t.name());
        for n in g.node_indices() {
            let m = s.shift_node(n, k);
            assert!(same_node(&g[n], &g[m]), "{} {n:?} -> {m:?}", t.name());
            assert_eq!(gpu_state(t, &g[n]), gpu_state(t, &g[m]));
            match s.host_of(n) {
                Some(h) => assert_eq!(
                    s.host_of(m),
                    Some(
                        ((u64::from(h) + u64::from(k) * u64::from(s.period()))
                            % u64::from(s.hosts())) as u32
                    ),
                    "{} {n:?}",
                    t.name()
                ),
                None => assert!(s.host_of(m).is_none()),
            }
        }
        // Links: a bijection onto links between the images of the ends, equal in every way.
        let images: BTreeSet<LinkId> = g.edge_indices().map(|e| s.shift_edge(e, k)).collect();
        assert_eq!(images.len(), g.edge_count(), "{} shift {k}", t.name());
        for e in g.edge_indices() {
            let f = s.shift_edge(e, k);
            let (a, b) = t.link_ends(e);
            assert_eq!(t.link_ends(f), (s.shift_node(a, k), s.shift_node(b, k)));
            assert!(same_link(t.link(e), t.link(f)));
            assert_eq!(t.link_usable(e), t.link_usable(f));
        }
    }
    // Representatives and round trips.
    let mut node_orbits = 0u32;
    for n in g.node_indices() {
        let r = s.rep_node(n);
        assert!(s.in_domain(r));
        assert_eq!(s.shift_node(r, s.periods_of_node(n)), n);
        assert!(s.periods_of_node(n) < s.node_orbit_size(n));
        assert_eq!(s.shift_node(n, s.node_orbit_size(n)), n);
        assert_eq!(s.periods() % s.node_orbit_size(n), 0);
        if let Some(h) = s.host_of(n) {
            assert_eq!(s.host_of(r), Some(h % s.period()));
            assert_eq!(s.periods_of_node(n), h / s.period());
            assert_eq!(s.node_orbit_size(n), s.periods());
            assert_eq!(s.in_domain(n), h < s.period());
        }
        if s.in_domain(n) {
            node_orbits += s.node_orbit_size(n);
        }
    }
    assert_eq!(node_orbits as usize, g.node_count());
    let mut edge_orbits = 0u32;
    for e in g.edge_indices() {
        let r = s.rep_edge(e);
        assert!(s.edge_in_domain(r));
        assert_eq!(s.shift_edge(r, s.periods_of_edge(e)), e);
        assert!(s.periods_of_edge(e) < s.edge_orbit_size(e));
        let (a, b) = t.link_ends(e);
        let (ra, rb) = t.link_ends(r);
        if s.host_of(a).is_some() && s.host_of(a) == s.host_of(b) {
            assert_eq!((ra, rb), (s.rep_node(a), s.rep_node(b)), "{}", t.name());
            assert_eq!(s.edge_orbit_size(e), s.periods());
        }
        if s.edge_in_domain(e) {
            edge_orbits += s.edge_orbit_size(e);
        }
    }
    assert_eq!(edge_orbits as usize, g.edge_count());
    for gpu in 0..t.gpu_count() {
        let r = s.rep_gpu(gpu);
        assert_eq!(s.shift_gpu(r, s.periods_of_gpu(gpu)), gpu);
        assert_eq!(s.host_of_gpu(gpu), t.node(t.gpu(gpu).unwrap()).host);
        assert_eq!(s.host_of_gpu(r), s.host_of_gpu(gpu) % s.period());
        assert_eq!(s.periods_of_gpu(gpu), s.host_of_gpu(gpu) / s.period());
        assert_eq!(s.rep_gpu(s.shift_gpu(gpu, 1)), r);
    }
}

fn period_of(spec: &str) -> (u32, u32) {
    let t = preset(spec).unwrap();
    let s = t.host_symmetry();
    check_laws(&t, &s);
    (s.hosts(), s.period())
}

#[test]
fn single_machine_is_trivial() {
    for spec in ["dgx-h100", "dgx1-v100", "gb200-nvl72", "host-4"] {
        let t = preset(spec).unwrap();
        let s = t.host_symmetry();
        assert_eq!((s.hosts(), s.period(), s.periods()), (1, 1, 1), "{spec}");
        assert!(s.is_trivial());
        check_laws(&t, &s);
    }
}

#[test]
fn one_switch_shifts_by_one_host() {
    // Every NIC hangs on NetSwitch0: any host can stand in for any other.
    assert_eq!(period_of("cluster:8xdgx-h100:ib-ndr"), (8, 1));
    assert_eq!(period_of("cluster:6xdgx1-v100:ib-edr:switch"), (6, 1));
    let t = preset("cluster:4xdgx-h100:ib-ndr").unwrap();
    let s = t.host_symmetry();
    let sw = t.node_by_name("NetSwitch0").unwrap();
    assert_eq!(s.host_of(sw), None, "fabric nodes belong to no host");
    assert_eq!(s.node_orbit_size(sw), 1, "every shift fixes the one switch");
    assert!(s.in_domain(sw));
}

#[test]
fn rails_in_one_unit_shift_by_one_host() {
    // NDR leaves take 32 nodes: 16 nodes are one scalable unit, NIC i of each on Leaf i.
    assert_eq!(period_of("cluster:16xdgx-h100:ib-ndr:rail"), (16, 1));
    // A rack preset: one unit of 4 racks, 72 rails.
    assert_eq!(period_of("cluster:4xgb200-nvl72:ib-ndr:rail"), (4, 1));
}

#[test]
fn rails_shift_by_a_scalable_unit() {
    // The SuperPOD: four units of 32 nodes. Within a unit a ring hop stays on its rail's leaf;
    // across units it climbs to a spine, so only a whole unit's shift keeps the fabric.
    assert_eq!(period_of("cluster:128xdgx-h100:ib-ndr:rail"), (128, 32));
    // 2:1 leaves keep floor(64 x 2 / 3) = 42 down ports: 84 nodes are two units.
    assert_eq!(period_of("cluster:84xdgx-h100:ib-ndr:rail=2:1"), (84, 42));
    // EDR leaves of 36 ports hold 18 nodes at 1:1; 20 nodes fill one unit and 2 of the next:
    // no shift but the identity maps the units onto each other.
    assert_eq!(period_of("cluster:20xdgx1-v100:ib-edr:rail=1:1"), (20, 20));
}

#[test]
fn fat_trees_shift_by_the_hosts_of_a_leaf() {
    // NDR at 1:1: 32 down ports hold 4 DGX H100 (8 NICs each); at 3:1, 48 hold 6.
    assert_eq!(period_of("cluster:16xdgx-h100:ib-ndr:fat-tree"), (16, 4));
    assert_eq!(
        period_of("cluster:12xdgx-h100:ib-ndr:fat-tree=3:1"),
        (12, 6)
    );
    // EDR at 1:1: 18 ports hold 4.5 DGX-1 (4 NICs each): the pattern repeats every 9 nodes.
    assert_eq!(period_of("cluster:18xdgx1-v100:ib-edr:fat-tree"), (18, 9));
}

#[test]
fn a_mask_that_sets_one_host_apart_breaks_the_symmetry() {
    let t = preset("cluster:8xdgx-h100:ib-ndr").unwrap();
    // GPU 27 is in host 3.
    let busy = t.with_mask(Mask::busy([27])).unwrap();
    let s = busy.host_symmetry();
    assert!(s.is_trivial());
    check_laws(&busy, &s);
    // The same GPU busy in every host keeps the one-host shift; in every other host, two.
    let every = t.with_mask(Mask::busy((0..8).map(|h| h * 8 + 3))).unwrap();
    assert_eq!(every.host_symmetry().period(), 1);
    let every_other = t
        .with_mask(Mask::busy((0..8).step_by(2).map(|h| h * 8 + 3)))
        .unwrap();
    let s = every_other.host_symmetry();
    assert_eq!(s.period(), 2);
    check_laws(&every_other, &s);
    // A link down in host 1 only.
    let mut m = Mask::default();
    m.link_down("node1/mlx5_0", "NetSwitch0");
    let down = t.with_mask(m).unwrap();
    let s = down.host_symmetry();
    assert!(s.is_trivial());
    check_laws(&down, &s);
}

#[test]
fn imported_and_uneven_topologies_are_trivial() {
    // A relaycc JSON round trip keeps hosts and so the symmetry.
    let t = preset("cluster:4xdgx-h100:ib-ndr:rail").unwrap();
    let back = crate::import::json::parse(&crate::export::to_json(&t), "back").unwrap();
    assert_eq!(back.host_symmetry().period(), 1);
    // Two machines' worth of nodes, all in host 0: one host.
    let mut b = crate::TopologyBuilder::new("flat");
    for numa in 0..2 {
        let cpu = b.add_cpu(numa, crate::rates::CpuFamily::IntelSkylake);
        let gpu = b.add_gpu(GpuInfo::new(numa));
        b.pcie(cpu, gpu, 3, 16);
    }
    let flat = b.build().unwrap();
    let s = flat.host_symmetry();
    assert_eq!((s.hosts(), s.period()), (1, 1));
    check_laws(&flat, &s);
    // Hosts of different machines, or of different sizes.
    let mut b = crate::TopologyBuilder::new("uneven");
    for h in 0..2 {
        b.begin_host(h);
        let cpu = b.add_cpu(0, crate::rates::CpuFamily::IntelSkylake);
        for i in 0..(h + 1) {
            let gpu = b.add_gpu(GpuInfo::new(h + i));
            b.pcie(cpu, gpu, 3, 16);
        }
    }
    let t = b.build().unwrap();
    let s = t.host_symmetry();
    assert!(s.is_trivial());
    check_laws(&t, &s);
    // A file may number hosts far beyond its nodes: they are hosts 0 and 1 once built, so
    // nothing is sized by the numbers given.
    let mut b = crate::TopologyBuilder::new("far");
    for (i, h) in [7, 4_000_000_000].into_iter().enumerate() {
        b.begin_host(h);
        let cpu = b.add_cpu(0, crate::rates::CpuFamily::IntelSkylake);
        let gpu = b.add_gpu(GpuInfo::new(i as u32));
        b.pcie(cpu, gpu, 3, 16);
    }
    let t = b.build().unwrap();
    assert_eq!(t.host_count(), 2);
    let hosts: Vec<u32> = (0..2).map(|i| t.node(t.gpu(i).unwrap()).host).collect();
    assert_eq!(hosts, [0, 1]);
    let s = t.host_symmetry();
    assert_eq!(s.hosts(), 2);
    check_laws(&t, &s);
    let mut b = crate::TopologyBuilder::new("last");
    b.begin_host(u32::MAX);
    b.add_gpu(GpuInfo::new(0));
    let t = b.build().unwrap();
    assert!(t.host_symmetry().is_trivial());
}

#[test]
fn out_of_range_ids_are_fixed_points() {
    let t = preset("cluster:4xdgx-h100:ib-ndr").unwrap();
    let s = t.host_symmetry();
    let n = NodeIndex::new(t.graph().node_count() + 5);
    assert_eq!((s.rep_node(n), s.shift_node(n, 3)), (n, n));
    assert_eq!(s.node_orbit_size(n), 1);
    let e = EdgeIndex::new(t.graph().edge_count() + 5);
    assert_eq!(
        (s.rep_edge(e), s.shift_edge(e, 3), s.edge_orbit_size(e)),
        (e, e, 1)
    );
    assert_eq!(
        (s.rep_gpu(99), s.shift_gpu(99, 2), s.host_of_gpu(99)),
        (99, 99, 4)
    );
}

#[test]
fn coarser_periods_are_subgroups() {
    let t = preset("cluster:8xdgx-h100:ib-ndr").unwrap();
    let s = t.host_symmetry();
    assert_eq!(s.period(), 1);
    for (period, ok) in [
        (0, false),
        (1, true),
        (2, true),
        (3, false),
        (4, true),
        (8, true),
    ] {
        let c = s.with_period(period);
        assert_eq!(c.is_some(), ok, "period {period}");
        if let Some(c) = c {
            assert_eq!((c.period(), c.periods()), (period, 8 / period));
            check_laws(&t, &c);
        }
    }
    let c = s.with_period(2).unwrap();
    // GPU 43 is GPU 3 of host 5: host 1 of the domain, two periods on.
    assert_eq!((c.rep_gpu(43), c.periods_of_gpu(43)), (11, 2));
    assert_eq!(c.shift_gpu(11, 3), 8 * 7 + 3);
    let t = preset("cluster:128xdgx-h100:ib-ndr:rail").unwrap();
    let s = t.host_symmetry();
    assert!(s.with_period(16).is_none() && s.with_period(48).is_none());
    let c = s.with_period(64).unwrap();
    assert_eq!(c.periods(), 2);
    check_laws(&t, &c);
}

#[test]
fn divisors_in_order() {
    assert_eq!(divisors(1), vec![1]);
    assert_eq!(divisors(12), vec![1, 2, 3, 4, 6, 12]);
    assert_eq!(divisors(16), vec![1, 2, 4, 8, 16]);
    assert_eq!(divisors(13), vec![1, 13]);
}

/// The period the fabric's construction implies (`preset/fabric.rs`), for `hosts` machines of
/// `nics` NICs each: one switch repeats every host; rails every scalable unit, when the units
/// are whole (a single unit repeats every host); a fat-tree every `lcm(P, nics) / nics` hosts
/// for leaves of `P` down ports, when the leaves are whole (a single leaf repeats every host).
fn expected_period(hosts: u32, nics: u32, spec: fabric::NetSpec) -> u32 {
    let whole = |p: u32| if hosts.is_multiple_of(p) { p } else { hosts };
    match spec.layout {
        _ if nics == 0 => 1,
        fabric::Layout::Switch => 1,
        fabric::Layout::Rail { down, up } => {
            let unit = fabric::leaf_down_ports(spec.link, down, up);
            if hosts <= unit { 1 } else { whole(unit) }
        }
        fabric::Layout::FatTree { down, up } => {
            let ports = fabric::leaf_down_ports(spec.link, down, up);
            if hosts * nics <= ports {
                1
            } else {
                whole(ports / gcd(ports, nics))
            }
        }
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

use crate::preset::fabric;

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random clusters and masks: the period is the one the fabric's construction implies,
    /// made a multiple that leaves the busy GPUs in place, and every law holds.
    #[test]
    fn random_clusters_have_the_period_their_fabric_implies(
        node in prop::sample::select(vec!["dgx-h100", "dgx1-v100", "dgx-a100", "pcie-4gpu", "gh200-quad", "l40s-8gpu"]),
        hosts in 1u32..40,
        link in prop::sample::select(vec!["ib-edr", "ib-hdr", "ib-ndr", "roce-100g", "eth-25g"]),
        layout in prop::sample::select(vec!["switch", "rail", "fat-tree"]),
        (down, up) in (1u32..5).prop_flat_map(|d| (Just(d), 1..=d)),
        busy in prop::option::of((1u32..40, 0u32..8)),
    ) {
        let net = if layout == "switch" { format!("{link}:switch") } else { format!("{link}:{layout}={down}:{up}") };
        let spec = format!("cluster:{hosts}x{node}:{net}");
        let plain = preset(&spec).unwrap();
        let per_host = plain.gpu_count() / hosts;
        let nics = (plain.nics().count() as u32) / hosts;
        let base = expected_period(hosts, nics, fabric::parse(&net).unwrap());
        let (t, want) = match busy {
            None => (plain, base),
            Some((every, gpu)) => {
                // GPU `gpu` of every `every`-th host is busy: a shift keeps the mask when it
                // moves those hosts onto each other.
                let gpu = gpu % per_host;
                let every = every.min(hosts);
                let set: BTreeSet<u32> = (0..hosts).step_by(every as usize).map(|h| h * per_host + gpu).collect();
                let keeps = |p: u32| set.iter().all(|g| set.contains(&((g + p * per_host) % (hosts * per_host))));
                let want = divisors(hosts).into_iter().find(|&p| p % base == 0 && keeps(p)).unwrap();
                (plain.with_mask(Mask::busy(set)).unwrap(), want)
            }
        };
        let s = t.host_symmetry();
        prop_assert_eq!(s.period(), want, "{}", spec);
        check_laws(&t, &s);
    }
}
