//! The zone's membership under faults, in the deterministic simulator:
//! the real foca state machines of `Membership` over a simulated network
//! (issue 5, "Tests"). Every test is reproducible from its seed; all times
//! are virtual, so the bounds are functional, not claims about this machine.

use std::net::SocketAddr;

use rollcall_config::{
    GossipPreset, SwimSettings, HARD_FAILURE_SLO_MS, SWIM_P99_FIRST_PROBE_PERIODS,
};
use rollcall_gossip::seal::{Sealer, ZoneKey};
use rollcall_gossip::sim::{sim_addr, sim_key, Sim, SimConfig, Status};
use rollcall_gossip::{DropReason, MembershipEvent, OpenError};

/// Runs until every live member sees every other one, or panics.
fn converge(sim: &mut Sim, within_ms: u64) {
    let deadline = sim.now_ms() + within_ms;
    while !sim.converged() {
        assert!(
            sim.now_ms() < deadline,
            "zone did not converge within {within_ms} ms"
        );
        sim.run_for(250);
    }
}

/// When each other non-killed member first saw `target` go down, in ms
/// after `since_us`; `None` for members that never did.
fn time_to_learn_down(sim: &Sim, target: usize, since_us: u64) -> Vec<Option<u64>> {
    let addr = sim_addr(target);
    (0..sim.len())
        .filter(|&i| i != target && sim.status(i) != Status::Killed)
        .map(|observer| {
            sim.events()
                .iter()
                .find(|r| {
                    r.observer == observer
                        && r.at_us >= since_us
                        && matches!(&r.event, MembershipEvent::Down(id) if id.addr == addr)
                })
                .map(|r| (r.at_us - since_us) / 1_000)
        })
        .collect()
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// A p99-style bound from the settings, like the budget calculator's
/// gossip path: p99 wait for a first probe, one period for it to fail,
/// the suspicion, and ten gossip rounds to spread the verdict.
fn detection_bound_ms(s: &SwimSettings) -> u64 {
    let first_probe = (SWIM_P99_FIRST_PROBE_PERIODS + 1.0) * s.probe_period_ms as f64;
    (first_probe + s.probe_period_ms as f64) as u64
        + s.suspect_to_down_ms
        + 10 * s.periodic_gossip_ms
}

#[test]
fn a_killed_member_is_declared_down_by_every_survivor() {
    let mut sim = Sim::new(50, SimConfig::lan(0xdead_0001));
    converge(&mut sim, 20_000);
    let mut samples = Vec::new();
    for victim in [7, 19, 23, 31, 42] {
        sim.run_for(5_000);
        let since = sim.now_us();
        sim.kill(victim);
        sim.run_for(20_000);
        for (observer, learned) in time_to_learn_down(&sim, victim, since)
            .into_iter()
            .enumerate()
        {
            let learned = learned.unwrap_or_else(|| {
                panic!("survivor #{observer} never declared member {victim} down")
            });
            samples.push(learned);
        }
    }
    samples.sort_unstable();
    let (p50, p99, max) = (
        percentile(&samples, 0.5),
        percentile(&samples, 0.99),
        samples[samples.len() - 1],
    );
    let bound = detection_bound_ms(&SimConfig::lan(0).settings);
    println!(
        "kill detection, 50 members, lan, {} samples: p50 {p50} ms, p99 {p99} ms, max {max} ms \
         (settings bound {bound} ms)",
        samples.len()
    );
    assert!(max as f64 <= HARD_FAILURE_SLO_MS, "max {max} ms");
    assert!(
        p99 <= bound,
        "p99 {p99} ms over the settings bound {bound} ms"
    );
}

#[test]
fn a_partitioned_member_is_suspected_then_merges_back() {
    let mut sim = Sim::new(50, SimConfig::lan(0xdead_0002));
    converge(&mut sim, 20_000);
    let isolated = 11;
    let addr = sim_addr(isolated);
    let since = sim.now_us();
    sim.partition(&[isolated]);
    let mut suspected = false;
    for _ in 0..20 {
        sim.run_for(250);
        suspected |= (0..sim.len())
            .filter(|&i| i != isolated)
            .any(|i| sim.member(i).suspects().any(|id| id.addr == addr));
    }
    let declared_down = sim.events().iter().any(|r| {
        r.at_us >= since
            && r.observer != isolated
            && matches!(&r.event, MembershipEvent::Down(id) if id.addr == addr)
    });
    assert!(suspected, "nobody suspected the partitioned member");
    assert!(declared_down, "nobody declared the partitioned member down");

    sim.heal();
    // The isolated member announces itself again (its periodic gossip meets
    // members that hold it down; they answer TurnUndead, it rejoins under
    // the next rejoin number); periodic announce backs that up.
    converge(&mut sim, 40_000);
    let back = sim.member(isolated).id().clone();
    let rejoined: Vec<usize> = sim
        .events()
        .iter()
        .filter(|r| r.at_us >= since && matches!(r.event, MembershipEvent::Rejoined(_)))
        .map(|r| r.observer)
        .collect();
    println!(
        "partition of member {isolated} for 5 s: merged by {} ms after the cut; rejoined: {rejoined:?}",
        (sim.now_us() - since) / 1_000
    );
    assert!(back.rejoin > 0, "it came back as a new identity: {back:?}");
    for i in (0..sim.len()).filter(|&i| i != isolated) {
        assert!(sim.member(i).members().any(|id| *id == back), "member {i}");
    }
}

/// Pauses `count` random members for `pause_ms` each, `gap_ms` apart, and
/// returns how many pauses ended with a false verdict about the paused
/// member (a Down anyone reported, or its own Rejoined / Defunct).
fn false_downs_across_pauses(seed: u64, fix: bool, count: usize, pause_ms: u64) -> (usize, u64) {
    let config = SimConfig {
        stale_undead_fix: fix,
        ..SimConfig::lan(seed)
    };
    false_downs_with(config, count, pause_ms)
}

fn false_downs_with(config: SimConfig, count: usize, pause_ms: u64) -> (usize, u64) {
    let seed = config.seed;
    let mut sim = Sim::new(50, config);
    converge(&mut sim, 20_000);
    let mut picker = seed;
    let mut falsely_downed = 0;
    for _ in 0..count {
        picker = picker
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let victim = (picker >> 33) as usize % sim.len();
        let addr = sim_addr(victim);
        let since = sim.now_us();
        sim.pause(victim, pause_ms);
        sim.run_for(pause_ms + 5_000);
        let wrong = sim.events().iter().any(|r| {
            r.at_us >= since
                && match &r.event {
                    MembershipEvent::Down(id) => id.addr == addr,
                    MembershipEvent::Rejoined(_) | MembershipEvent::Defunct => r.observer == victim,
                    _ => false,
                }
        });
        falsely_downed += usize::from(wrong);
        // Let a wrongly downed member find its way back before the next one.
        if wrong {
            converge(&mut sim, 60_000);
        }
    }
    let suppressed = (0..sim.len())
        .map(|i| sim.member(i).stale_undead_dropped())
        .sum();
    (falsely_downed, suppressed)
}

#[test]
fn one_second_pauses_never_produce_a_down_verdict() {
    let (falsely_downed, suppressed) = false_downs_across_pauses(0xdead_0003, true, 30, 1_000);
    println!("30 one-second pauses with the fix: {falsely_downed} false downs, {suppressed} stale TurnUndead suppressed");
    assert_eq!(falsely_downed, 0);
}

#[test]
fn without_the_turn_undead_fix_pauses_produce_false_downs() {
    let (falsely_downed, _) = false_downs_across_pauses(0xdead_0003, false, 30, 1_000);
    println!("30 one-second pauses without the fix: {falsely_downed} false downs");
    assert!(
        falsely_downed > 0,
        "the foca 2.0.0 bug no longer reproduces"
    );
}

/// Kills three members one after another, 30 s apart, and returns the
/// slowest survivor's time to learn of a kill, in ms (a survivor that never
/// did counts as the whole 30 s), and how many never did.
fn slowest_survivor_ms(members: usize, max_transmissions: u8, seed: u64) -> (u64, usize) {
    let config = SimConfig {
        settings: SwimSettings {
            max_transmissions,
            ..SimConfig::lan(seed).settings
        },
        ..SimConfig::lan(seed)
    };
    let mut sim = Sim::new(members, config);
    let victims = [members / 4, members / 2, 3 * members / 4];
    // With 6 transmissions even joins take long to reach everyone, so wait
    // only until everyone knows the victims (needed to see them go down).
    let known_to_all = |sim: &Sim, victim: usize| {
        (0..members).filter(|&i| i != victim).all(|i| {
            sim.member(i)
                .members()
                .any(|id| id.addr == sim_addr(victim))
        })
    };
    while !victims.iter().all(|&v| known_to_all(&sim, v)) {
        assert!(
            sim.now_ms() < 120_000,
            "the victims never became known to all"
        );
        sim.run_for(250);
    }
    let window_ms = 30_000;
    let (mut slowest, mut never) = (0, 0);
    for victim in victims {
        sim.run_for(2_000);
        let since = sim.now_us();
        sim.kill(victim);
        sim.run_for(window_ms);
        for learned in time_to_learn_down(&sim, victim, since) {
            never += usize::from(learned.is_none());
            slowest = slowest.max(learned.unwrap_or(window_ms));
        }
    }
    (slowest, never)
}

/// Issue 5 item 3: with foca's `new_lan` default of 6 transmissions some
/// survivors never hear a Down update and learn it only by probing the dead
/// member themselves, tens of seconds later. With the `lan` preset of
/// 350/150/1200 ms, 11 of the 16 seeds 0xdead_000a–0019 show that tail
/// (a survivor slower than 14 s or never), and 5 do not; with 12
/// transmissions none does (slowest 2.4–3.3 s). The test pins seed
/// 0xdead_000a, which has it (the simulation is deterministic).
#[test]
fn max_transmissions_6_leaves_a_tail_that_12_does_not() {
    let seed = 0xdead_000a;
    let ((slow_6, never_6), (slow_12, never_12)) = std::thread::scope(|scope| {
        let six = scope.spawn(|| slowest_survivor_ms(200, 6, seed));
        let twelve = slowest_survivor_ms(200, 12, seed);
        (six.join().expect("simulation with 6 ran"), twelve)
    });
    println!(
        "200 members, three kills: slowest survivor {slow_6} ms with max_transmissions 6 \
         ({never_6} never heard within 30 s), {slow_12} ms with 12 ({never_12} never heard)"
    );
    assert_eq!(never_12, 0);
    assert!(slow_12 <= detection_bound_ms(&SimConfig::lan(0).settings));
    assert!(slow_6 > 2 * slow_12, "6: {slow_6} ms, 12: {slow_12} ms");
}

#[test]
fn forged_and_foreign_packets_never_reach_foca() {
    let mut sim = Sim::new(5, SimConfig::lan(0xdead_0005));
    converge(&mut sim, 10_000);
    let target = 2;
    let before: Vec<_> = sim.member(target).members().cloned().collect();
    let from: SocketAddr = sim_addr(3);

    // A genuine packet from member 3 would be accepted; tamper with one.
    let mut insider = Sealer::new(sim_key(), None, 99);
    let mut packet = insider.seal(b"not even a foca header").expect("fits");
    let last = packet.len() - 1;
    packet[last] ^= 0x80;
    assert_eq!(
        sim.inject(target, from, &packet),
        Err(DropReason::Open(OpenError::Forged { key_id: 1 }))
    );

    let mut outsider = Sealer::new(ZoneKey::new(7, [1; 32]), None, 98);
    let foreign = outsider.seal(b"hello").expect("fits");
    assert_eq!(
        sim.inject(target, from, &foreign),
        Err(DropReason::Open(OpenError::UnknownKey { key_id: 7 }))
    );

    // Authentic but not foca: refused by foca, counted separately.
    let garbage = insider.seal(&[0xff; 40]).expect("fits");
    assert!(matches!(
        sim.inject(target, from, &garbage),
        Err(DropReason::Refused { .. })
    ));

    let drops = sim.member(target).drops();
    assert_eq!(
        (drops.open.forged, drops.open.unknown_key, drops.refused),
        (1, 1, 1)
    );
    let after: Vec<_> = sim.member(target).members().cloned().collect();
    assert_eq!(before, after);
}

#[test]
fn the_tolerant_preset_survives_two_second_pauses_and_lan_does_not() {
    let tolerant = SimConfig {
        settings: GossipPreset::Tolerant.settings(),
        ..SimConfig::lan(0xdead_0005)
    };
    let (tolerant_downs, _) = false_downs_with(tolerant, 30, 2_000);
    let (lan_downs, _) = false_downs_with(SimConfig::lan(0xdead_0005), 30, 2_000);
    println!("30 two-second pauses: tolerant {tolerant_downs} false downs, lan {lan_downs}");
    assert_eq!(tolerant_downs, 0);
    assert!(
        lan_downs > 0,
        "lan is documented not to tolerate 2-s pauses"
    );
}

#[test]
fn the_tolerant_preset_still_declares_a_killed_member_down() {
    let settings = GossipPreset::Tolerant.settings();
    let mut sim = Sim::new(
        32,
        SimConfig {
            settings,
            ..SimConfig::lan(0xdead_0006)
        },
    );
    converge(&mut sim, 20_000);
    let mut first = Vec::new();
    for victim in [3, 9, 14, 22, 27, 30] {
        sim.run_for(3_000);
        let since = sim.now_us();
        sim.kill(victim);
        sim.run_for(15_000);
        let learned: Vec<u64> = time_to_learn_down(&sim, victim, since)
            .into_iter()
            .map(|t| t.unwrap_or_else(|| panic!("a survivor never declared {victim} down")))
            .collect();
        first.push(*learned.iter().min().expect("survivors"));
    }
    first.sort_unstable();
    let bound = detection_bound_ms(&settings);
    println!("tolerant, 32 members: first down verdict after a kill {first:?} ms (settings bound {bound} ms)");
    assert!(*first.last().unwrap() <= bound);
}
