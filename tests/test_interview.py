"""`course interview`: every template on 100 seeds, the named mistakes, scripted sessions, the student's copy."""
import io
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import cli, interview
from autograder.interview import answer, templates
from autograder.interview.question import Numeric, Open, fmt
from autograder.interview.session import Session, deck, instance

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = interview.all_templates()
SEEDS = range(100)


def build(t, seed):
    return t.build(random.Random(f"{seed}:{t.key}"), templates.solutions(t.stem))


def typed(q: Numeric) -> str:
    """The answer as the worked answer shows it, with its unit: what a learner who got it right types."""
    return f"{fmt(q.answer)} {q.unit}".strip()


def in_base_units(q: Numeric) -> str:
    """The answer written in the base unit of its kind (7,168 bytes for 7 KiB, 0.5 s for 500 ms, 8.03e9 for 8.03
    billion parameters), as a learner who converts it would type it."""
    want = answer.asked(q.unit)
    value = q.answer * float(want.factor)
    base = {"bytes": "bytes", "bits": "bits", "time": "s", "GPU time": "s", "bytes/time": "bytes/s",
            "bits/time": "bits/s", "count/time": "/s"}.get(want.kind, "")
    return f"{value!r} {base}".strip()


def test_every_ready_lesson_has_five_numeric_templates_and_an_open_one():
    from autograder import lessons
    ready = [lesson.stem for lesson in lessons.available()]
    assert set(interview.stems()) <= set(ready)
    for stem in ready:
        kinds = [type(build(t, 0)).__name__ for t in templates.for_lesson(stem)]
        assert kinds.count("Numeric") >= 5 and "Open" in kinds, (
            f"{stem} is ready but has {kinds.count('Numeric')} numeric interview templates and "
            f"{kinds.count('Open')} open ones (want 5+ and 1+): add them to autograder/interview/{stem}.py (see "
            "l02_kv_cache.py there; found from the stem)")


@pytest.mark.parametrize("t", TEMPLATES, ids=[t.key for t in TEMPLATES])
def test_template_instances_on_100_seeds(t):
    """Valid instances; the reference answer passes its own tolerance (also as displayed and typed back); every
    named mistake fails it, and each main question names at least one."""
    prompts = set()
    for seed in SEEDS:
        q = build(t, seed)
        if isinstance(q, Open):
            assert q.prompt and q.why and len(q.rubric) >= 4 and all(q.rubric)
            continue
        prompts.add(q.prompt)
        assert q.follow_ups, f"{t.key} seed {seed}: no follow-up"
        assert q.mistakes, f"{t.key} seed {seed}: no named mistake this instance can tell from the answer"
        for x in (q, *q.follow_ups):
            assert x.prompt and x.why and x.steps and all(isinstance(s, str) and s for s in x.steps)
            assert math.isfinite(x.answer) and x.rtol >= 0 and (x is q or not x.follow_ups)
            assert x.rtol > 0 or float(x.answer).is_integer(), f"{t.key}: an exact answer must be a whole number"
            assert x.grade(x.answer)
            value, problem = answer.parse(typed(x), x.unit)
            assert problem is None and x.grade(value), (t.key, seed, typed(x), x.answer, x.rtol)
            value, problem = answer.parse(in_base_units(x), x.unit)  # the same answer in bytes, s, a raw count...
            assert problem is None and x.grade(value), (t.key, seed, in_base_units(x), x.answer, x.rtol)
            for name, wrong in x.mistakes.items():
                assert not x.grade(wrong), (t.key, seed, name)
                assert x.mistake(wrong) is not None
    if prompts:
        assert len(prompts) >= 10, f"{t.key}: only {len(prompts)} different questions in 100 seeds"


@pytest.mark.parametrize("key, mistake, how", [
    ("l02_kv_cache:KV bytes per token", "counts only K, not K and V", lambda q: q.answer / 2),
    ("l02_kv_cache:KV bytes per token", "counts bits, not bytes", lambda q: q.answer * 8),
    ("l06_capacity_planning:KV per token per GPU under TP", "forgets the TP split", None),
    ("l01_roofline:ridge point", "uses the sparse TFLOP/s figure", lambda q: 2 * q.answer),
    ("l15_attention_layouts:cache per token by layout", None, None),
])
def test_the_lessons_named_mistakes_are_graded_wrong_and_named(key, mistake, how):
    t = next(t for t in TEMPLATES if t.key == key)
    for seed in range(20):
        q = build(t, seed)
        names = list(q.mistakes) if mistake is None else [mistake]
        for name in names:
            assert name in q.mistakes, (seed, sorted(q.mistakes))
            wrong = q.mistakes[name] if how is None else how(q)
            assert not q.grade(wrong) and name in q.mistake(wrong)


def test_lesson_02_says_what_a_conversation_keeps_between_requests():
    """Lesson 02: a running request holds its whole context's cache; when it finishes the engine frees it, and only a
    prefix cache (vLLM's automatic prefix caching, SGLang's RadixAttention) keeps it, until evicted. No question may
    ask how much a conversation holds between its requests as if the engine kept it."""
    t = next(t for t in TEMPLATES if t.key == "l02_kv_cache:KV per conversation")
    for seed in range(20):
        q = build(t, seed)
        assert "while it runs" in q.prompt and "between" not in q.prompt, q.prompt
        assert "run at once" in q.follow_ups[0].prompt
        assert "frees" in q.why and "prefix cach" in q.why and "evicted" in q.why, q.why
    for t in templates.for_lesson("l02_kv_cache"):
        for seed in range(20):
            q = build(t, seed)
            texts = [q.prompt, q.why, *q.rubric] if isinstance(q, Open) else \
                [x for f in (q, *q.follow_ups) for x in (f.prompt, f.why, *f.steps)]
            for text in texts:
                if re.search(r"between (two of its |its |two )?(requests|turns)", text):
                    assert "prefix cache" in text and "frees" in text, (t.key, text)
    explain = next(build(t, 0) for t in templates.for_lesson("l02_kv_cache") if isinstance(build(t, 0), Open))
    assert any("between turns the engine frees it, unless a prefix cache keeps it" in p for p in explain.rubric)


def scripted(stems, seed, lines, questions=None, minutes=None, clock=None):
    """Run a session on `lines` of input (then end of input); returns (record, everything written)."""
    out, feed = [], io.StringIO("".join(line + "\n" for line in lines))

    def read(prompt):
        line = feed.readline()
        return line.rstrip("\n") if line else None

    s = Session(stems, seed, read, out.append, minutes=minutes, questions=questions,
                clock=clock or (lambda: 0.0))
    return s.run(), "\n".join(out)


def test_a_scripted_session_ends_with_the_right_summary():
    stems, seed = ["l02_kv_cache", "l06_capacity_planning"], 11
    qs = [(t, instance(t, seed)) for t in deck(stems, seed)[:4]]
    lines, expect = [], {s: {"right": 0, "wrong": 0, "points": 0} for s in stems}
    for t, q in qs:
        if isinstance(q, Open):
            lines += ["the cache, per token, times the context", "1 3"]
            expect[t.stem]["points"] += 2
            continue
        lines.append(typed(q))                                   # the main question: right
        expect[t.stem]["right"] += 1
        for f in q.follow_ups:                                   # follow-ups: a named mistake, or skipped
            lines.append(fmt(next(iter(f.mistakes.values()))) if f.mistakes else "skip")
            expect[t.stem]["wrong"] += 1
    record, text = scripted(stems, seed, lines, questions=4)
    assert record["ended_by"] == "deck"
    for stem in stems:
        got = record["per_lesson"][stem]
        assert (got["right"], got["wrong"], got["points_marked"]) == \
            (expect[stem]["right"], expect[stem]["wrong"], expect[stem]["points"]), (stem, got)
    right = sum(v["right"] for v in expect.values())
    wrong = sum(v["wrong"] for v in expect.values())
    assert f"Numeric answers: {right} right, {wrong} wrong or skipped" in text
    assert "Worked answer:" in text and "Intuition:" in text
    assert set(record["revisit"]) == {s for s in stems if expect[s]["wrong"]}
    named = [i for i in record["items"] if i["mistake"]]
    assert named and all(f"if your reasoning {i['mistake']}" in text for i in named)


def test_bad_input_is_asked_again_never_a_traceback():
    stem, seed = "l02_kv_cache", 3
    t = deck([stem], seed)[0]
    q = instance(t, seed)
    while not isinstance(q, Numeric):
        seed += 1
        t = deck([stem], seed)[0]
        q = instance(t, seed)
    wrong_unit = "ms" if q.unit != "ms" else "GB"
    lines = ["", "twelve", f"12 {wrong_unit}", "12 Gbit", "12 G", "help", typed(q)]
    record, text = scripted([stem], seed, lines, questions=1)
    assert "Type a number" in text and "is not a number I can read" in text
    assert f"{wrong_unit!r} reads as" in text and "reads as bits" in text and "'skip' shows the answer" in text
    assert "'G' could mean" in text
    assert record["items"][0]["status"] == "right" and record["items"][0]["typed"] == typed(q)
    assert "Not quite" not in text and "Traceback" not in text


@pytest.mark.parametrize("text, unit, value", [
    ("12", "GB", 12.0), ("12.5 GB", "GB", 12.5), ("12.5gb", "GB", 12.5), ("1,024", "tokens", 1024.0),
    ("40%", "%", 40.0), ("3.5e9 bytes", "bytes", 3.5e9), ("2.3x", "x", 2.3), ("8.03B", "billion parameters", 8.03),
    ("153 FLOP/byte", "FLOP/byte", 153.0), ("17 users", "users", 17.0),
])
def test_numbers_with_the_asked_unit_are_read(text, unit, value):
    assert answer.parse(text, unit) == (value, None)


BILLIONS = ["8.03", "8.03e9", "8.03E+09", "8.03B", "8.03b", "8.03 B", "8.03 billion", "8.03 bn", "8030M", "8,030M",
            "8,030,000,000", "8030000000", "8.03x10^9", "8.03e9 parameters", "8,030,000,000 params", "8.03B params",
            "8.03 billion parameters", "8,030,000 thousand"]


@pytest.mark.parametrize("text", BILLIONS)
def test_a_count_in_billions_reads_every_notation_as_the_same_value(text):
    """`course interview`'s help suggests 3.5e9: for a question in billions it means 3.5 billion, not 3.5e9 billion."""
    r = answer.read(text, "billion parameters")
    assert r.problem is None and r.value == 8.03, (text, r)
    assert r.shown.startswith("read as ") and r.shown.endswith("8.03 billion parameters"), r.shown


def test_the_feedback_says_how_a_count_was_read():
    assert answer.read("8.03e9", "billion parameters").shown == "read as 8.03e9 parameters = 8.03 billion parameters"
    assert answer.read("8030M", "billion parameters").shown == \
        "read as 8030 million parameters = 8.03 billion parameters"
    assert answer.read("8.03", "billion parameters").shown == "read as 8.03 billion parameters"
    assert answer.read("1,666,526", "million tokens").shown == "read as 1,666,526 tokens = 1.66653 million tokens"
    assert answer.read("0.5 GiB", "GB").shown == "read as 0.5 GiB = 0.536871 GB"


@pytest.mark.parametrize("text, unit, value", [
    # bytes: powers of 1,000 (kB, MB, GB, TB) and of 1,024 (KiB, MiB, GiB, TiB), converted exactly
    ("0.5 GiB", "GB", 2**29 / 1e9), ("536870912 bytes", "GiB", 0.5), ("512 MiB", "GiB", 0.5), ("500 MB", "GB", 0.5),
    ("1.5 TB", "GB", 1500.0), ("1 TiB", "GiB", 1024.0), ("2 GB", "GiB", 2e9 / 2**30), ("7 KiB", "bytes", 7168.0),
    ("7.168 kB", "bytes", 7168.0), ("7.168 KB", "bytes", 7168.0), ("7168 B", "bytes", 7168.0),
    ("69120 bytes", "KiB", 67.5), ("18 MiB", "MB", 18.874368), ("0.018874368 GB", "MB", 18.874368),
    ("1 gigabyte", "MB", 1000.0), ("2 gibibytes", "MiB", 2048.0), ("0.5 gib", "MiB", 512.0),
    # times
    ("557 us", "ms", 0.557), ("557 µs", "ms", 0.557), ("557μs", "ms", 0.557), ("5.57e-4 s", "ms", 0.557),
    ("0.557 msec", "ms", 0.557), ("1280 ms", "s", 1.28), ("1.28 sec", "s", 1.28), ("2 min", "s", 120.0),
    ("1.5e6 ns", "ms", 1.5), ("1 h", "s", 3600.0),
    # rates
    ("96.6 Gbps", "Gb/s", 96.6), ("96.6 Gbit/s", "Gb/s", 96.6), ("96,600 Mb/s", "Gb/s", 96.6),
    ("0.0966 Tb/s", "Gb/s", 96.6), ("3.35 TB/s", "GB/s", 3350.0), ("3350 GB/s", "TB/s", 3.35),
    ("4.8e12 bytes/s", "TB/s", 4.8), ("18.3 req/min", "requests/s", 0.305), ("0.305 rps", "req/s", 0.305),
    ("0.305 requests per second", "requests/s", 0.305), ("1.5k tokens/s", "tokens/s", 1500.0), ("2/s", "req/s", 2.0),
    # counts
    ("1.67M", "million tokens", 1.67), ("1666526", "million tokens", 1.666526),
    ("5,000", "million tokens", 0.005), ("957,924,864", "billion parameters", 0.957924864), ("999", "million tokens", 999.0), ("1.67 million", "million tokens", 1.67),
    ("32k", "tokens", 32000.0), ("32,768 tokens", "tokens", 32768.0), ("27 conversations", "users", 27.0),
    ("296 seqs", "sequences", 296.0), ("7 replicas", "", 7.0), ("169 GPU-hours", "GPU-h", 169.0), ("169 h", "GPU-h", 169.0),
    # other notations
    ("~12", "GB", 12.0), ("12.", "GB", 12.0), (".5", "GB", 0.5), ("-3", "%", -3.0), ("40 percent", "%", 40.0),
    ("2.3 times", "x", 2.3), ("31.3 flops/byte", "FLOP/byte", 31.3),
])
def test_units_of_the_asked_kind_convert_exactly(text, unit, value):
    r = answer.read(text, unit)
    assert r.problem is None and r.value == pytest.approx(value, rel=1e-12), (text, unit, r)


@pytest.mark.parametrize("text, unit, message", [
    ("8 GiB", "billion parameters", "'GiB' reads as bytes: this question asks for a count of parameters in billions"),
    ("16 GB", "billion parameters", "reads as bytes"),
    ("8.03 tokens", "billion parameters", "'tokens' reads as a count of tokens"),
    ("8030", "billion parameters", "'8030' could be 8030 parameters"),          # parameters or billions?
    ("50,000", "billion parameters", "add the unit"),
    ("12 G", "GB", "'G' could mean GB (1,000,000,000 bytes) or GiB (1,073,741,824 bytes)"),
    ("18.87 M", "MB", "could mean MB"), ("7 K", "bytes", "could mean kB"),
    ("8 Gb", "GB", "reads as bits"), ("12 Gbit", "bytes", "reads as bits"), ("12 GB/s", "Gb/s", "reads as bytes per second"),
    ("12 Gb/s", "GB/s", "reads as bits per second"), ("12.5 GB/s", "GB", "reads as bytes per second"),
    ("5 tokens/s", "requests/s", "reads as tokens per second"), ("3 ms", "", "this question asks for a plain number"),
    ("3 s", "GB", "reads as a time"), ("3 GB", "ms", "reads as bytes"), ("3 B", "ms", "reads as bytes or a count"),
    ("0.4x", "%", "reads as a ratio"), ("40%", "x", "reads as a percentage"), ("12 users", "tokens", "a count of users"),
    ("1,5", "ms", "write decimals with a point"), ("12,5 GB", "GB", "write decimals with a point"),
    ("", "ms", "Type a number in ms"), ("abc", "x", "is not a number I can read"), ("twelve GB", "GB", "not a number"),
    ("12 furlongs", "GB", "'furlongs' is not a unit I can read"), ("12 GB of memory", "GB", "not a unit I can read"),
    ("1e999", "GB", "out of range"), ("1/3", "x", "not a unit I can read"),
])
def test_anything_else_gets_a_message(text, unit, message):
    r = answer.read(text, unit)
    assert r.value is None and r.shown is None and message in r.problem, (text, unit, r.problem)
    assert answer.parse(text, unit) == (None, r.problem)


def test_a_session_grades_a_converted_answer_and_says_how_it_read_it():
    """The parameter count typed as a raw count (1e9 x the answer) and in GiB: the first is graded right, the second
    is asked again, not graded."""
    key, seed = "l06_capacity_planning:parameter count", 0
    t = next(t for t in TEMPLATES if t.key == key)
    stems = [t.stem]
    seed = next(s for s in range(200) if deck(stems, s)[0].key == key)
    q = instance(t, seed)
    assert q.unit == "billion parameters"
    raw = f"{q.answer * 1e9:.6e}"
    record, text = scripted(stems, seed, [f"{q.answer:.3f} GiB", raw], questions=1)
    main = record["items"][0]
    assert main["status"] == "right" and main["typed"] == raw and main["given"] == pytest.approx(q.answer, rel=1e-6)
    assert f"Right: read as {raw} parameters = " in text and main["read_as"] in text
    assert "'GiB' reads as bytes" in text and "Not quite" not in text.split("Follow-up")[0]
    assert "all read as 7 billion parameters" in text     # the prompt says what a bare number means


def test_end_of_input_ends_the_session_with_its_summary():
    record, text = scripted(["l01_roofline"], 5, [])
    assert record["ended_by"] == "end of input"
    assert record["items"][0]["status"] == "unanswered"
    assert "Session summary" in text and "1 question(s) left unanswered" in text


def test_quit_and_the_time_limit_end_the_session():
    record, text = scripted(["l03_continuous_batching"], 2, ["quit"])
    assert record["ended_by"] == "quit" and "Session summary" in text
    ticks = iter(range(0, 10**6, 61))  # every clock reading is a minute later
    record, text = scripted(["l03_continuous_batching"], 2, ["skip"] * 50, minutes=2, clock=lambda: next(ticks))
    assert record["ended_by"] == "time" and "Time is up (2 min)." in text
    assert 0 < len(record["items"]) < 6


def test_the_same_seed_asks_the_same_questions():
    stems = interview.stems()
    first = [instance(t, 42) for t in deck(stems, 42)]
    again = [instance(t, 42) for t in deck(stems, 42)]
    other = [instance(t, 43) for t in deck(stems, 43)]
    assert [q.prompt for q in first] == [q.prompt for q in again]
    assert [getattr(q, "answer", None) for q in first] == [getattr(q, "answer", None) for q in again]
    assert [q.prompt for q in first] != [q.prompt for q in other]
    # the lessons' order on the command line does not change the session
    assert interview.resolve(["06", "02"]) == interview.resolve(["02", "06"]) == ["l02_kv_cache", "l06_capacity_planning"]


def test_course_interview_through_stdin_writes_json(tmp_path):
    out = tmp_path / "session.json"
    r = subprocess.run([sys.executable, "-m", "autograder.cli", "interview", "02", "--seed", "9", "--questions", "2",
                        "--json", str(out)], input="skip\n" * 40, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["seed"] == 9 and data["lessons"] == ["l02_kv_cache"] and data["ended_by"] == "deck"
    mains = [i for i in data["items"] if not i["follow_up"]]
    assert len(mains) == 2 and "Session summary" in r.stdout
    assert "course interview --seed 9 02" in r.stdout
    assert [i["prompt"] for i in data["items"]] == \
        [x.prompt for t in deck(["l02_kv_cache"], 9)[:2] for q in [instance(t, 9)]
         for x in ([q, *q.follow_ups] if isinstance(q, Numeric) else [q])]


def test_unknown_or_unready_lessons_exit_2(capsys, monkeypatch):
    from autograder.interview import templates
    monkeypatch.delitem(templates.REGISTRY, "l17_disaggregation")  # every lesson has questions: pretend one has none
    assert cli.main(["interview", "17"]) == 2
    assert "has no interview questions yet" in capsys.readouterr().err
    assert cli.main(["interview", "99"]) == 2


RUN_IN_COPY = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]
sys.path[:] = [p for p in sys.path if "editable" not in p and ("site-packages" in p or not p.startswith({root!r}))]
sys.path.insert(0, {copy!r})
from autograder.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_copy_without_solutions_says_so_and_exits_2(tmp_path):
    """A student's copy holds autograder/ (this package included) and the engine, but no solutions/."""
    copy = tmp_path / "course"
    copy.mkdir()
    shutil.copytree(ROOT / "autograder", copy / "autograder", ignore=shutil.ignore_patterns("__pycache__", "visible"))
    os.symlink(ROOT / "reference_engine", copy / "reference_engine")
    code = RUN_IN_COPY.format(root=str(ROOT), copy=str(copy))
    r = subprocess.run([sys.executable, "-c", code, "interview", "--seed", "1"], cwd=copy, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(copy)}, input="1\n")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Mock interviews need the full course" in r.stderr and "Traceback" not in r.stderr


def test_notebook_helper_asks_one_question(monkeypatch, capsys):
    answers = iter(["skip"] * 10)
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    record = interview.ask("04", seed=3)
    assert record["lessons"] == ["l04_paged_attention"]
    assert sum(not i["follow_up"] for i in record["items"]) == 1
    out = capsys.readouterr().out
    assert "Worked answer:" in out or "Key points" in out
    assert "ask('04', seed=3)" in out


def test_without_solutions_the_helper_and_the_command_say_so(monkeypatch, capsys):
    monkeypatch.setattr(templates.course_reference, "solutions_available", lambda: False)
    assert interview.ask("01") is None
    assert "Mock interviews need the full course" in capsys.readouterr().out
    assert cli.main(["interview"]) == 2
    assert "Mock interviews need the full course" in capsys.readouterr().err
