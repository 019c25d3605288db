"""The capacity probe's HTML report: drawn from the record alone."""

from __future__ import annotations

from pathlib import Path

from chaos.capacity.report import CURVE, RECORD, REPORT, draw_curves, main, write_report
from controlplane.kernel.capacity.bearing import CapacitySLO
from controlplane.kernel.capacity.record import (
    CapacityRecord,
    HitProbe,
    ProbeStep,
    WorkloadProfile,
)


def steps(*rows: tuple[float, float, float]) -> tuple[ProbeStep, ...]:
    return tuple(
        ProbeStep(offered_rps=r, p99_ttft_s=p99, error_rate=err, throughput_rps=min(r, 30))
        for r, p99, err in rows
    )


def record() -> CapacityRecord:
    cold = HitProbe(
        hit_rate=0.0,
        baseline_p99_s=0.12,
        knee_rps=21.0,
        ultimate_rps=27.5,
        ultimate_bounded=True,
        failure_rps=40.0,
        steps=steps((10, 0.12, 0), (15, 0.14, 0), (22.5, 0.3, 0), (33.75, 2.5, 0.01), (40, 9, 0.2)),
    )
    warm = HitProbe(
        hit_rate=0.62,
        baseline_p99_s=0.05,
        knee_rps=40.0,
        ultimate_rps=55.0,
        ultimate_bounded=False,
        steps=steps((10, 0.05, 0), (30, 0.06, 0), (55, 0.4, 0)),
    )
    return CapacityRecord(
        region="eu-west",
        measured_at=1_790_000_000.0,
        engine_version="0.32.0",
        model="tiny",
        replica="http://127.0.0.1:9001",
        slo=CapacitySLO(ttft_p99_s=1.0),
        factor_of_safety=2.0,
        probes=(cold, warm),
        r_base_rps=27.5,
        beta=0.83,
        t_recover_s=3.2,
        wasted_work_share=0.04,
        profile=WorkloadProfile(
            prompt_tokens_p50=800, prompt_tokens_p90=2000, output_tokens=16, shared_prefix_share=0.6
        ),
        probe_s=95.0,
    )


def test_the_report_marks_knee_ultimate_and_allowed_and_keeps_the_record(tmp_path: Path) -> None:
    page = write_report(record(), tmp_path, aborted="")
    assert page == tmp_path / REPORT and (tmp_path / CURVE).stat().st_size > 10_000
    text = page.read_text()
    for needle in (
        "Capacity probe: eu-west",
        "27.5 rps",
        "13.8 rps",
        "55.0 rps (at least)",
        "0.830",
        "3.20 s",
        "4.0%",
        "assumed",
        "hit rate 62%",
    ):
        assert needle in text, needle
    assert CapacityRecord.model_validate_json((tmp_path / RECORD).read_text()) == record()
    legends = [ax.get_legend() for ax in draw_curves(record()).axes]
    labels = {t.get_text() for lg in legends if lg is not None for t in lg.texts}
    assert {"knee 21.0", "ultimate 27.5", "allowed 13.8", "ultimate 55.0 (lower bound)"} <= labels


def test_an_aborted_probe_says_so(tmp_path: Path) -> None:
    text = write_report(record(), tmp_path, aborted="errors 20% at 40 rps").read_text()
    assert 'class="aborted">Aborted: errors 20% at 40 rps' in text


def test_the_command_draws_it_again_and_refuses_what_is_not_a_record(
    tmp_path: Path, capsys: object
) -> None:
    write_report(record(), tmp_path)
    (tmp_path / REPORT).unlink()
    assert main([str(tmp_path / RECORD)]) == 0 and (tmp_path / REPORT).exists()
    bad = tmp_path / "bad.json"
    bad.write_text('{"region": "x"}')
    assert main([str(bad)]) == 2
    assert main([str(tmp_path / "missing.json")]) == 2
