//! Ranks on several machines, played on one machine with `SYMM_HOST_ID` (a process per rank,
//! host backend). symm makes no communicator across machines yet: every rank's
//! `symmCommInitRank` refuses, naming the machines and their ranks, whether the ranks of a
//! machine are contiguous or not; ranks that all name one machine form a communicator as
//! usual.

use std::ptr::null_mut;
use std::time::Duration;
use symm::*;
use symm_tests::*;

const CHILD: &str = "machine_rank";

/// Run 4 rank processes, rank `r` naming machine `hosts[r]`; every rank's log.
fn ranks_on(hosts: [&str; 4], expect: &str) -> Vec<(bool, String)> {
    use_host_backend();
    let id = id_to_hex(&new_unique_id());
    let ranks: Vec<Vec<(String, String)>> = hosts
        .iter()
        .enumerate()
        .map(|(rank, host)| {
            vec![
                ("SYMM_BACKEND".into(), "host".into()),
                ("SYMM_HOST_ID".into(), host.to_string()),
                ("SYMM_BOOTSTRAP_TIMEOUT_MS".into(), "60000".into()),
                ("MACHINE_TEST_ID".into(), id.clone()),
                ("MACHINE_TEST_RANK".into(), rank.to_string()),
                ("MACHINE_TEST_EXPECT".into(), expect.to_string()),
            ]
        })
        .collect();
    run_rank_processes(CHILD, &ranks, Duration::from_secs(120))
}

/// Two machines of two ranks each, and two interleaved: refused on every rank, naming them.
#[test]
fn ranks_on_several_machines_are_refused_on_every_rank_naming_them() {
    for (hosts, machines) in [
        (["a", "a", "b", "b"], "ranks [0, 1], ranks [2, 3]"),
        (["a", "b", "a", "b"], "ranks [0, 2], ranks [1, 3]"),
    ] {
        let outcomes = ranks_on(hosts, machines);
        for (rank, (ok, log)) in outcomes.iter().enumerate() {
            assert!(
                *ok && log.contains(&format!("machine rank {rank}: refused as expected")),
                "{hosts:?}, rank {rank}:\n{log}"
            );
        }
    }
}

/// Every rank naming one machine: a communicator as usual.
#[test]
fn ranks_naming_one_machine_form_a_communicator() {
    let outcomes = ranks_on(["a", "a", "a", "a"], "");
    for (rank, (ok, log)) in outcomes.iter().enumerate() {
        assert!(
            *ok && log.contains(&format!("machine rank {rank}: joined")),
            "rank {rank}:\n{log}"
        );
    }
}

/// One rank process of the tests above: joins, and checks the refusal (`MACHINE_TEST_EXPECT`
/// names the machines' ranks) or that the communicator works.
#[test]
#[ignore = "a rank process of the machines tests"]
fn machine_rank() {
    let rank: usize = std::env::var("MACHINE_TEST_RANK").unwrap().parse().unwrap();
    let id = id_from_hex(&std::env::var("MACHINE_TEST_ID").unwrap());
    let expect = std::env::var("MACHINE_TEST_EXPECT").unwrap();
    let mut comm = null_mut();
    // SAFETY: a valid out-pointer.
    let result = unsafe { symmCommInitRank(&mut comm, 4, id, rank as i32) };
    if expect.is_empty() {
        check(result, null_mut());
        let mut size = 0;
        // SAFETY: a valid out-pointer.
        check(unsafe { symmCommCount(comm, &mut size) }, comm);
        assert_eq!(size, 4);
        check(symmCommDestroy(comm), null_mut());
        println!("machine rank {rank}: joined");
        return;
    }
    assert_eq!(result, symmResult_t::symmUnsupported);
    let message = last_error(null_mut());
    for needle in [
        &format!("the ranks span 2 machines ({expect};"),
        "SYMM_HOST_ID",
        "no communicator across machines",
    ] {
        assert!(message.contains(needle), "{message:?} lacks {needle:?}");
    }
    println!("machine rank {rank}: refused as expected");
}
