"""The accounting broker's arithmetic and protocol (pure: the C client tests its sockets)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.isolation.accounting import MAX_CONNECTIONS, Account

MiB = 2**20


def test_a_reservation_past_the_limit_is_refused_with_the_numbers() -> None:
    account = Account((1024 * MiB,))
    a, b = account.connect(), account.connect()
    assert a is not None and b is not None
    assert account.answer(a, f"reserve 0 {600 * MiB}\n".encode()) == b"ok\n"
    assert account.answer(b, f"reserve 0 {500 * MiB}\n".encode()) == (
        f"refused {600 * MiB} {1024 * MiB}\n".encode()
    )
    assert account.answer(b, b"used 0\n") == f"used {600 * MiB} {1024 * MiB}\n".encode()


def test_a_connection_gives_back_only_its_own_and_all_of_it_when_it_closes() -> None:
    account = Account((1024 * MiB,))
    a, b = account.connect(), account.connect()
    assert a is not None and b is not None
    account.answer(a, b"reserve 0 600")
    assert account.answer(b, b"release 0 600") == b"ok\n"  # b held nothing: nothing changes
    assert account.used(0) == 600
    account.answer(a, b"release 0 999999")  # capped at what a holds
    assert account.used(0) == 0
    account.answer(a, b"reserve 0 100")
    account.answer(a, b"hold 0 2000")  # declared after a reconnect: no check, it is held
    assert account.used(0) == 2100
    account.disconnect(a)
    assert account.used(0) == 0
    assert account.answer(a, b"used 0") == b"error this connection is closed\n"


@pytest.mark.parametrize(
    ("line", "answer"),
    [
        (b"", b"error unknown request: use reserve, release, hold, used or active\n"),
        (
            b"RESERVE 0 1",
            b"error unknown request: use reserve, release, hold, used or active\n",
        ),
        (b"reserve 0", b"error reserve takes 2 decimal number(s)\n"),
        (b"reserve 0 -5", b"error reserve takes 2 decimal number(s)\n"),
        (b"reserve 0 1e9", b"error reserve takes 2 decimal number(s)\n"),
        (b"reserve  0 1", b"error reserve takes 2 decimal number(s)\n"),
        ("reserve 0 \u0661".encode(), b"error reserve takes 2 decimal number(s)\n"),
        (b"used 0 1", b"error used takes 1 decimal number(s)\n"),
        (b"used 2", b"error device 2 is not this container's\n"),
        (b"active 2", b"error device 2 is not this container's\n"),
        (b"active 0 1", b"error active takes 1 decimal number(s)\n"),
        (
            b"\xff\xfe 0 1",
            b"error unknown request: use reserve, release, hold, used or active\n",
        ),
    ],
)
def test_malformed_requests_change_nothing(line: bytes, answer: bytes) -> None:
    account = Account((GiB := 1024 * MiB, GiB))
    conn = account.connect()
    assert conn is not None
    assert account.answer(conn, line) == answer
    assert account.used(0) == account.used(1) == 0


def test_one_limit_stands_for_every_device_as_in_the_limits_file() -> None:
    account = Account((MiB,))
    assert account.limit(0) == account.limit(15) == MiB
    assert account.limit(16) is None and account.limit(-1) is None
    assert Account((MiB, 2 * MiB)).limit(1) == 2 * MiB


def test_a_container_holds_at_most_so_many_connections() -> None:
    account = Account((MiB,))
    conns = [account.connect() for _ in range(MAX_CONNECTIONS)]
    assert None not in conns
    assert account.connect() is None
    account.disconnect(conns[0] or 0)
    assert account.connect() is not None


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive byte counts"):
        Account((0,))
    with pytest.raises(ValueError, match="at most 16 devices"):
        Account(tuple([MiB] * 17))


@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # connection
            st.sampled_from(["reserve", "release", "close"]),
            st.integers(0, 2 * MiB),
        ),
        max_size=60,
    )
)
def test_reservations_never_take_the_container_past_its_limit(
    steps: list[tuple[int, str, int]],
) -> None:
    """Whatever its processes ask, in any order, only ``hold`` can exceed the limit."""
    account = Account((MiB,))
    conns: dict[int, int] = {}
    for who, verb, amount in steps:
        if who not in conns:
            new = account.connect()
            assert new is not None
            conns[who] = new
        if verb == "close":
            account.disconnect(conns.pop(who))
            continue
        before = account.used(0)
        answer = account.answer(conns[who], f"{verb} 0 {amount}".encode())
        assert answer == b"ok\n" or answer.startswith(b"refused ")
        assert account.used(0) <= MiB
        if verb == "release":
            assert account.used(0) >= before - amount


def test_activity_is_acknowledged_and_charges_nothing() -> None:
    account = Account((MiB, MiB))
    conn = account.connect()
    assert conn is not None
    assert account.answer(conn, b"active 1\n") == b"ok\n"
    assert account.used(0) == account.used(1) == 0


def test_pids_is_no_longer_a_request() -> None:
    """The compute limit is time slices now: nothing asks for the container's pids."""
    account = Account((MiB,))
    conn = account.connect()
    assert conn is not None
    assert account.answer(conn, b"pids\n").startswith(b"error unknown request")
