"""Unit: the registry (requirements, chunks, placement), CSV interop and its CLI, and
hand-made V-placement schedules the validator must reject (pure, fast)."""

from __future__ import annotations

import pytest

from harness.planning import theory
from harness.schedules.registry import built_in, build, chunks_per_rank, requirements
from harness.schedules.csv_io import from_csv, read_csv, to_csv, write_csv
from harness.schedules.export import main as export_main
from harness.schedules.ir import Action, stage_to_rank
from harness.schedules.validate import ScheduleError, validate


def acts(text: str) -> list[Action]:
    return [Action.parse(x) for x in text.split()]


@pytest.mark.parametrize("name,n,m,v,message", [
    ("gpipe", 4, 8, 2, "virtual_stages=2: gpipe has no chunks (allowed: 1)"),
    ("zb_h1", 4, 8, 3, "virtual_stages=3: zb_h1 has no chunks (allowed: 1)"),
    ("zbv", 4, 8, 3, "virtual_stages=3: zbv places exactly 2 chunks per rank (allowed: 1 or 2, both mean 2)"),
    ("dualpipev", 4, 7, 1, "microbatches=7: dualpipev needs at least 2 * pp = 8"),
    ("interleaved_1f1b", 4, 9, 2,
     "microbatches=9: interleaved_1f1b needs M < pp=4 or a multiple of its M // pp = 2 rounds (nearest allowed: 8, 10)"),
    ("1f1b", 0, 8, 1, "pp=0: needs at least 1"),
    ("1f1b", 4, 0, 1, "microbatches=0: needs at least 1"),
    ("interleaved_1f1b", 4, 8, 0, "virtual_stages=0: needs at least 1"),
    ("zb_h9", 4, 8, 1, "schedule=zb_h9: no builder (have: gpipe, 1f1b, interleaved_1f1b, zb_h1, zb_h2, zbv, dualpipev)"),
])
def test_requirements_name_the_key_the_value_and_what_is_allowed(name, n, m, v, message):
    assert requirements(name, n, m, v) == message
    with pytest.raises(KeyError if name not in built_in() else ValueError, match="^'?" + message.split(":")[0]):
        build(name, n, m, v)


@pytest.mark.parametrize("name,n,m,v", [
    ("zbv", 4, 1, 1), ("zbv", 4, 3, 2), ("dualpipev", 4, 8, 2), ("interleaved_1f1b", 4, 3, 3),
    ("interleaved_1f1b", 4, 10, 2), ("interleaved_1f1b", 4, 12, 1), ("zb_h1", 8, 1, 1), ("gpipe", 1, 1, 1),
])
def test_requirements_accept(name, n, m, v):
    assert requirements(name, n, m, v) is None


def test_chunks_and_placement():
    """Stage s lives on rank s (one chunk), s % N (interleaved), or the V: s < N ? s : 2N-1-s."""
    n = 4
    for name in built_in():
        v = 3 if name == "interleaved_1f1b" else 1
        c = chunks_per_rank(name, v)
        assert c == {"interleaved_1f1b": 3, "zbv": 2, "dualpipev": 2}.get(name, 1)
        place = {s: s % n if name == "interleaved_1f1b" else s if s < n else 2 * n - 1 - s for s in range(n * c)}
        assert stage_to_rank(build(name, n, 8, v)) == place, name


def test_interleaved_matches_megatron_when_n_divides_m():
    """(N-1) / (VM + N-1): Megatron's bubble (N-1)/M shrunk V times, per unit of one rank's work."""
    for n, m, v in ((4, 8, 2), (4, 16, 3), (8, 32, 2), (2, 2, 4)):
        assert theory.bubble_fraction("interleaved_1f1b", n, m, v) == pytest.approx((n - 1) / (v * m + n - 1))


# -- CSV -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(built_in()))
def test_csv_round_trip_is_the_identity(name):
    for n in (1, 2, 3, 5):
        for m in range(1, 13):
            for v in (1, 2, 3):
                if requirements(name, n, m, v) is None:
                    s = build(name, n, m, v)
                    assert from_csv(to_csv(s)) == s, (n, m, v)


def test_csv_format_is_torch_compute_only(tmp_path):
    """No header, one row per rank, one action per cell; torch's empty cells (idle slots)
    are skipped and its OVERLAP_F_B cells (DualPipeV dumps) expand to their sub-actions."""
    s = build("1f1b", 2, 2)
    assert to_csv(s) == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"
    write_csv(tmp_path / "s.csv", s)
    assert read_csv(tmp_path / "s.csv") == s
    assert from_csv("0F0,,0F1, ,0B0,0B1\r\n,1F0,1B0,1F1,1B1\r\n") == s
    assert from_csv("0F0,3F0,(0F1;3B0)OVERLAP_F_B\n") == {0: acts("0F0 3F0 0F1 3B0")}


@pytest.mark.parametrize("text,where,cell", [
    ("0F0,0X1\n", "row 1 (rank 0), column 2", "'0X1'"),
    ("0F0,0B0\n1F0,F0\n", "row 2 (rank 1), column 2", "'F0'"),
    ("0F0,0F\n", "row 1 (rank 0), column 2", "'0F'"),
    ("1UNSHARD,0F0\n", "row 1 (rank 0), column 1", "'1UNSHARD'"),
    ("0F0,0SEND_F0\n", "row 1 (rank 0), column 2", "'0SEND_F0'"),
    ("0F0,(0F1;junk)OVERLAP_F_B\n", "row 1 (rank 0), column 2", "'(0F1;junk)OVERLAP_F_B'"),
])
def test_malformed_csv_names_row_column_and_cell(text, where, cell):
    with pytest.raises(ScheduleError) as err:
        from_csv(text)
    first = str(err.value).splitlines()[0]
    assert where in first and cell in first and "not a compute action" in first


def test_deadlocking_csv_is_rejected_by_validate_with_the_grid():
    # rank 0 waits for the gradient of microbatch 0; rank 1 runs microbatch 1 first and waits for 0F1
    s = from_csv("0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n")
    with pytest.raises(ScheduleError) as err:
        validate(s, 2, 2)
    text = str(err.value)
    assert text.startswith("invalid schedule: deadlock: rank 0 0B0 waits for gradient of 1B0/1I0; "
                           "rank 1 1F1 waits for activation of 0F1\n")
    assert "rank 0:  0F0 [0B0] 0F1  0B1" in text and "rank 1: [1F1] 1F0" in text


def test_export_cli_writes_the_validated_csv(tmp_path, capsys):
    out = tmp_path / "zbv.csv"
    assert export_main(["zbv", "--pp", "2", "--microbatches", "3", "-o", str(out)]) == 0
    assert read_csv(out) == build("zbv", 2, 3)
    assert export_main(["interleaved_1f1b", "--pp", "2", "--microbatches", "4", "--virtual-stages", "2"]) == 0
    assert from_csv(capsys.readouterr().out) == build("interleaved_1f1b", 2, 4, 2)
    assert export_main(["dualpipev", "--pp", "4", "--microbatches", "6"]) == 2
    assert capsys.readouterr().err == "error: microbatches=6: dualpipev needs at least 2 * pp = 8\n"


# -- hand-made V schedules (N=2: stages 0, 3 on rank 0; 1, 2 on rank 1) -----------------


@pytest.mark.parametrize("rank0,rank1,message,marked", [
    # the turn 1 -> 2 is a local hand-off on rank 1: 2F0 cannot precede 1F0
    ("0F0 3F0 3B0 0B0", "2F0 1F0 2B0 1B0", "2F0 comes before 1F0, which feeds it on the same rank", "[2F0]"),
    # and the gradient 2 -> 1 too
    ("0F0 3F0 3I0 3W0 0B0", "1F0 2F0 1I0 2I0 2W0 1W0", "1I0 comes before 2B0/2I0, which feeds it", "[1I0]"),
    ("0F0 3F0 3W0 3I0 0B0", "1F0 2F0 2B0 1B0", "3W0 comes before its 3I0", "[3W0]"),
    # 0B0 needs the gradient of 1B0 <- 2B0 <- 3B0, which rank 0 runs only after it
    ("0F0 3F0 0B0 3B0", "1F0 2F0 2B0 1B0", "deadlock: rank 0 0B0 waits for gradient of 1B0/1I0", "[0B0]"),
    ("0F0 3F0 3B0 0B0 2B0", "1F0 2F0 1B0", "stage 2 runs on ranks 0 and 1", "[2F0]"),
    ("0F0 3F0 3I0 3B0 3W0 0B0", "1F0 2F0 2B0 1B0", "3B0 and 3I0/3W0 both present", None),
    # rank 0 starts chunk 1 before anything reached it, rank 1 waits for rank 0's 0F0: a cycle
    ("3F0 0F0 3B0 0B0", "1F0 2F0 2B0 1B0", "deadlock: rank 0 3F0 waits for activation of 2F0", "[3F0]"),
])
def test_validator_rejects_bad_v_schedules(rank0, rank1, message, marked):
    schedule = {0: acts(rank0), 1: acts(rank1)}
    with pytest.raises(ScheduleError) as err:
        validate(schedule, 4, 1)
    text = str(err.value)
    assert message in text.splitlines()[0]
    assert "rank 0:" in text and "rank 1:" in text  # the whole grid
    if marked:
        assert marked in text


def test_validator_accepts_the_hand_made_v_schedule():
    validate({0: acts("0F0 3F0 3I0 0I0 3W0 0W0"), 1: acts("1F0 2F0 2B0 1B0")}, 4, 1)
