"""The calibrated clock's memory fraction per chip comes from a measurement when one is recorded, and every recorded
number carries where it came from (reference_engine/sim/measured.py)."""
import json

import pytest

from reference_engine.sim import calibration, measured
from reference_engine.sim.gpu_model import A100, H200, LLAMA_3_8B, Composition

RECORD = {"chip": H200.name, "device_name": "NVIDIA H200", "date": "2026-12-04", "torch": "2.11.0", "triton": "3.6.0",
          "method": "CUDA events, best of 20: torch.sum of a bf16 buffer (read), copy_ (read+write)",
          "read_GB_s": 4320.0, "copy_GB_s": 4100.0, "peak_GB_s": 4800.0, "buffer_GiB": 4.0}


def write(tmp_path, records):
    path = tmp_path / "measured_memory.json"
    path.write_text(json.dumps(records))
    return path


def test_the_shipped_table_is_valid_and_every_chip_says_where_its_fraction_comes_from():
    measured.load()  # raises on a record without its provenance
    for chip in calibration.CALIBRATIONS:
        source = calibration.CALIBRATIONS[chip].mem_eff_source
        assert source.startswith(("CITED", "ASSUMPTION", "measured by gpu_check")), (chip, source)


def test_a_measured_chip_gets_its_measured_fraction_and_its_provenance(tmp_path):
    table = write(tmp_path, [RECORD, {**RECORD, "date": "2026-11-01", "read_GB_s": 3000.0}])
    cal = calibration.calibration_for(H200, table)
    assert cal.mem_eff == pytest.approx(4320 / 4800)  # the newest record of the chip, not the older one
    assert "NVIDIA H200" in cal.mem_eff_source and "2026-12-04" in cal.mem_eff_source
    assert calibration.calibration_for(A100, table) == calibration.CALIBRATIONS[A100.name]  # other chips unchanged
    decode = Composition.decode_batch(64, 4096)
    slow = calibration.step_time(LLAMA_3_8B, H200, decode, calibration=calibration.calibration_for(H200))
    fast = calibration.step_time(LLAMA_3_8B, H200, decode, calibration=cal)
    assert fast.time_s < slow.time_s  # a memory-bound step reads at the measured, higher, bandwidth


@pytest.mark.parametrize("change, why", [
    ({"date": None}, "date"), ({"device_name": 1}, "device_name"), ({"read_GB_s": 5000.0}, "between 0"),
    ({"read_GB_s": True}, "read_GB_s")])
def test_a_record_without_provenance_or_with_an_impossible_number_is_refused(tmp_path, change, why):
    with pytest.raises(ValueError, match=why):
        measured.load(write(tmp_path, [{**RECORD, **change}]))
    missing = {k: v for k, v in RECORD.items() if k != "method"}
    with pytest.raises(ValueError, match="lacks method"):
        measured.validate(missing)


def test_add_appends_gpu_checks_record_to_the_table(tmp_path, capsys):
    table = write(tmp_path, [])
    record = tmp_path / "measured-memory.json"
    record.write_text(json.dumps(RECORD))
    measured.add(record, table)
    assert measured.load(table) == {H200.name: RECORD}
    record.write_text(json.dumps({**RECORD, "torch": None}))
    with pytest.raises(ValueError, match="torch"):
        measured.add(record, table)
    assert len(json.loads(table.read_text())) == 1  # nothing appended
