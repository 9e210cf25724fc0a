"""The sampler's rules on a fake host: membership, fences, sums, activity, unavailability."""

from __future__ import annotations

import pytest

from services.telemetry_agent.domain import (
    ACCESS_DENIED,
    IDENTITY_MISMATCH,
    NOT_LINUX,
    OTHER_PID_NAMESPACE,
    PROCESS_NOT_FOUND,
    Figures,
    Member,
    Observation,
    Watch,
)
from services.telemetry_agent.sampler import Sampler
from tests.unit.telemetry_agent.fakehost import FakeHost

ROOT = Watch("task-1", 100, 1000)


@pytest.fixture
def host() -> FakeHost:
    h = FakeHost()
    h.spawn(100, ppid=50, start_time=1000, cpu_user_ticks=7, write_count=3, write_bytes=30)
    return h


def sampler_for(host: FakeHost, **kw: object) -> Sampler:
    return Sampler(host, table_source=host.table, clock=host.clock, linux=True, own_pid_namespace=1, **kw)  # type: ignore[arg-type]


def one(sampler: Sampler, watch: Watch = ROOT) -> Observation:
    [obs] = sampler.sample([watch])
    return obs


def test_the_first_sample_is_a_baseline_and_activity_moves_only_with_counters(host: FakeHost) -> None:
    s = sampler_for(host)
    first = one(s)
    assert first.available and not first.ended
    assert first.figures == Figures(cpu_user_ticks=7, write_count=3, write_bytes=30)
    assert first.last_activity_at is None  # counters found at the baseline moved at an unknown time
    assert first.members == (Member(100, 1000),)

    quiet = one(s)
    assert quiet.last_activity_at is None and quiet.figures == first.figures

    host.work(100, cpu_user_ticks=5)
    busy = one(s)
    assert busy.figures is not None and busy.figures.cpu_user_ticks == 12
    assert busy.last_activity_at == busy.observed_at

    later = one(s)
    assert later.observed_at > busy.observed_at
    assert later.last_activity_at == busy.observed_at  # observation time is not activity time


def test_any_counter_counts_as_activity(host: FakeHost) -> None:
    s = sampler_for(host)
    one(s)
    for counter in ("cpu_system_ticks", "read_count", "read_bytes", "write_count"):
        host.work(100, **{counter: 1})
        obs = one(s)
        assert obs.last_activity_at == obs.observed_at, counter


def test_a_new_child_joins_with_all_its_figures_and_its_exit_moves_nothing(host: FakeHost) -> None:
    s = sampler_for(host)
    base = one(s)
    host.spawn(101, ppid=100, write_count=4, write_bytes=40)
    with_child = one(s)
    assert with_child.members == (Member(100, 1000), Member(101, 1010))
    assert with_child.figures == base.figures + Figures(write_count=4, write_bytes=40)  # type: ignore[operator]
    assert with_child.last_activity_at == with_child.observed_at

    host.exit(101)  # a zombie: not a member any more, nothing read, nothing moves
    zombie = one(s)
    assert zombie.members == (Member(100, 1000),)
    assert zombie.figures == with_child.figures
    assert zombie.last_activity_at == with_child.observed_at

    host.reap(101)  # the kernel folds the child's I/O into the parent: not new work
    reaped = one(s)
    assert reaped.figures == with_child.figures
    assert reaped.last_activity_at == with_child.observed_at
    assert one(s).last_activity_at == with_child.observed_at


def test_work_a_child_did_between_its_last_sample_and_its_exit_is_counted_once(host: FakeHost) -> None:
    s = sampler_for(host)
    one(s)
    host.spawn(101, ppid=100, cpu_user_ticks=2)
    seen = one(s)
    host.work(101, cpu_user_ticks=3, write_count=1)
    host.exit(101)
    host.reap(101)
    after = one(s)
    assert after.figures == seen.figures + Figures(cpu_user_ticks=3, write_count=1)  # type: ignore[operator]
    assert after.last_activity_at == after.observed_at


def test_a_short_lived_child_between_samples_counts_through_its_parent(host: FakeHost) -> None:
    s = sampler_for(host)
    base = one(s)
    host.spawn(101, ppid=100, cpu_user_ticks=4, read_bytes=100)
    host.exit(101)
    host.reap(101)
    obs = one(s)
    assert obs.figures == base.figures + Figures(cpu_user_ticks=4, read_bytes=100)  # type: ignore[operator]
    assert obs.last_activity_at == obs.observed_at


def test_a_subtree_reaped_at_once_is_not_double_counted(host: FakeHost) -> None:
    s = sampler_for(host)
    one(s)
    host.spawn(101, ppid=100, write_bytes=10)
    host.spawn(102, ppid=101, write_bytes=20)
    seen = one(s)
    assert [m.pid for m in seen.members] == [100, 101, 102]
    host.exit(102)
    host.reap(102)  # into 101
    host.exit(101)
    host.reap(101)  # into 100, carrying 102's figures
    after = one(s)
    assert after.members == (Member(100, 1000),)
    assert after.figures == seen.figures
    assert after.last_activity_at == seen.observed_at


def test_a_child_reparented_outside_is_no_longer_claimed(host: FakeHost) -> None:
    s = sampler_for(host)
    one(s)
    host.spawn(101, ppid=100, write_bytes=10)
    seen = one(s)
    host.procs[101].ppid = 1  # e.g. a daemonising double fork
    out = one(s)
    assert out.members == (Member(100, 1000),)
    assert out.figures == seen.figures  # what it contributed stays; sums never go backwards
    host.work(101, write_bytes=1000)
    assert one(s).last_activity_at == seen.observed_at  # its later work is not the task's


def test_processes_outside_the_tree_are_not_members(host: FakeHost) -> None:
    host.spawn(200, ppid=1)
    host.spawn(201, ppid=200)
    obs = one(sampler_for(host))
    assert obs.members == (Member(100, 1000),)


def test_a_credit_lapses_when_the_parent_never_folds_the_child_in(host: FakeHost) -> None:
    s = sampler_for(host)
    one(s)
    host.spawn(101, ppid=100, write_bytes=50)
    one(s)
    host.exit(101)
    host.autoreap(101)  # SIGCHLD ignored: nothing is folded into 100
    vanished = one(s)
    host.work(100, write_bytes=10)
    absorbed = one(s)  # within the credit window: taken as the missing fold
    assert absorbed.last_activity_at == vanished.last_activity_at
    host.work(100, write_bytes=10)
    counted = one(s)  # the credit has lapsed
    assert counted.last_activity_at == counted.observed_at


def test_a_wrong_start_time_is_another_process_and_never_reported(host: FakeHost) -> None:
    s = sampler_for(host)
    obs = one(s, Watch("task-2", 100, 999))
    assert obs.ended and not obs.available
    assert obs.reason == IDENTITY_MISMATCH
    assert obs.figures is None and obs.members == ()
    assert 100 not in host.reads
    assert s.tracked() == 0


def test_a_pid_that_does_not_exist_ends_at_once(host: FakeHost) -> None:
    obs = one(sampler_for(host), Watch("task-3", 4242, 5))
    assert obs.ended and not obs.available and obs.reason == PROCESS_NOT_FOUND


def test_a_root_that_exited_before_the_first_sample_is_not_found(host: FakeHost) -> None:
    host.exit(100)
    obs = one(sampler_for(host))
    assert obs.ended and obs.reason == PROCESS_NOT_FOUND


def test_the_end_carries_the_last_sums_and_no_members(host: FakeHost) -> None:
    s = sampler_for(host)
    one(s)
    host.work(100, cpu_user_ticks=1)
    busy = one(s)
    host.exit(100)
    end = one(s)
    assert end.ended and end.available
    assert end.figures == busy.figures and end.members == ()
    assert end.last_activity_at == busy.observed_at
    assert s.tracked() == 0


def test_pid_reuse_after_the_root_exits_ends_the_tree_without_reading_the_newcomer(host: FakeHost) -> None:
    s = sampler_for(host)
    one(s)
    del host.procs[100]
    host.spawn(100, ppid=1, start_time=5000, cpu_user_ticks=999)
    reads_before = len(host.reads)
    end = one(s)
    assert end.ended and end.figures is not None and end.figures.cpu_user_ticks == 7
    assert len(host.reads) == reads_before


def test_an_unreadable_member_makes_the_tree_unavailable_and_guesses_nothing(host: FakeHost) -> None:
    s = sampler_for(host)
    one(s)
    host.work(100, cpu_user_ticks=1)
    busy = one(s)
    host.spawn(101, ppid=100).denied = True
    denied = one(s)
    assert not denied.available and denied.reason == ACCESS_DENIED
    assert "101" in (denied.reason_detail or "")
    assert denied.figures is None
    assert denied.members == (Member(100, 1000), Member(101, 1010))
    assert denied.last_activity_at == busy.observed_at  # the last known activity, kept
    host.work(100, write_count=1)
    host.procs[101].denied = False
    back = one(s)
    assert back.available and back.last_activity_at == back.observed_at


def test_an_unreadable_root_ends_unavailable(host: FakeHost) -> None:
    host.procs[100].denied = True
    s = sampler_for(host)
    assert one(s).reason == ACCESS_DENIED
    host.exit(100)
    end = one(s)
    assert end.ended and not end.available and end.reason == ACCESS_DENIED


def test_a_member_in_another_pid_namespace_is_unavailable(host: FakeHost) -> None:
    s = sampler_for(host)
    one(s)
    host.spawn(101, ppid=100).ns = 2
    obs = one(s)
    assert not obs.available and obs.reason == OTHER_PID_NAMESPACE


def test_not_linux_is_unavailable_and_reads_nothing(host: FakeHost) -> None:
    s = Sampler(host, table_source=host.table, clock=host.clock, linux=False)
    obs = one(s)
    assert not obs.available and obs.reason == NOT_LINUX and not obs.ended
    assert host.table_calls == 0 and host.reads == []


def test_one_table_scan_per_sample_for_all_trees_and_one_read_per_member(host: FakeHost) -> None:
    watches = []
    for i in range(50):
        root = 1000 + 10 * i
        host.spawn(root, ppid=1)
        host.spawn(root + 1, ppid=root)
        host.spawn(root + 2, ppid=root + 1)
        watches.append(Watch(f"t{i}", root, root * 10))
    s = sampler_for(host)
    observations = s.sample(watches)
    assert host.table_calls == 1
    assert len(host.reads) == 150
    assert all(len(o.members) == 3 and o.available for o in observations)


def test_keep_drops_the_state_of_unwatched_trees(host: FakeHost) -> None:
    s = sampler_for(host)
    one(s)
    assert s.tracked() == 1
    assert s.sample([], keep=[]) == []
    assert s.tracked() == 0
    assert one(s).last_activity_at is None  # a fresh baseline


def test_a_member_that_vanishes_between_scan_and_read_moves_nothing(host: FakeHost) -> None:
    s = sampler_for(host)
    one(s)
    host.spawn(101, ppid=100, write_bytes=10)
    seen = one(s)
    original = host.read

    def racing_read(pid: int, start_time: int) -> Figures:
        if pid == 101:  # reaped by its parent right after the table scan
            host.procs[101].state = "Z"
            host.reap(101)
        return original(pid, start_time)

    host.read = racing_read  # type: ignore[method-assign]
    after = one(s)
    assert after.figures == seen.figures
    assert after.last_activity_at == seen.observed_at
    host.read = original  # type: ignore[method-assign]
    # The fold may only show in the parent's next reading: still not activity.
    assert one(s).last_activity_at == seen.observed_at
