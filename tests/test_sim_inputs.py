"""``icl sim`` on bad or partial input: one exit code, one clear line, nothing filled in silently."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from icl.cli import main
from simulator.clusterspec import SpecError, load_cluster
from simulator.jobs import Job, JobFormatError, read_jobs, write_jobs_csv
from simulator.openb import TraceError, read_nodes, read_pods
from simulator.timebase import SHARE_POLICIES, TIME_POLICIES
from simulator.timesim import run_time
from topology.policy import PolicyName

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "openb-gpu-2023"
needs_data = pytest.mark.skipif(not (DATA / "openb_pod_list_default.csv").exists(), reason="openb data absent")

CLUSTER = (
    "pools:\n"
    "  - name: r\n    count: 2\n    topology: ring:4\n    cpu_milli: 64000\n    memory_mib: 262144\n    model: R\n"
    "  - name: t\n    count: 2\n    topology: full:4\n    cpu_milli: 64000\n    memory_mib: 262144\n    model: T4\n"
)
NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"n{i},64000,262144,4,T4\n" for i in range(4))
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n" + "".join(
    f"p{i},4000,16384,1,{500 if i % 2 else 1000},{i * 10},{i * 10 + 600}\n" for i in range(20)
)


def code_of(argv: Sequence[str]) -> int:
    """The exit code of ``icl ARGV``, whether argparse exits or the handler returns."""
    try:
        return main(list(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {
        "cluster": tmp_path / "cluster.yaml",
        "nodes": tmp_path / "openb_node_list_gpu_node.csv",
        "pods": tmp_path / "openb_pod_list_default.csv",
        "trace": tmp_path / "jobs.csv",
    }
    out["cluster"].write_text(CLUSTER)
    out["nodes"].write_text(NODES)
    out["pods"].write_text(PODS)
    write_jobs_csv(
        [Job(f"j{i}", i * 5.0, 300.0, 2, "ring", queue="a" if i % 2 else "b") for i in range(6)], out["trace"]
    )
    return out


# ---- inputs a run must refuse rather than fill in or ignore silently ---------------------------


@pytest.mark.parametrize("mode", [[], ["--mode", "fill"], ["--mode", "time"], ["--mode", "both"]])
def test_pods_without_a_cluster_is_a_usage_error(
    mode: list[str], files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert code_of(["sim", *mode, "--pods", str(files["pods"]), "--out", str(tmp_path / "o"), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--pods" in err and "--nodes" in err and "--cluster" in err
    assert not (tmp_path / "o").exists()


def test_fidelity_is_not_claimed_for_files_that_only_share_the_published_names(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Files named like the paper's (openb_pod_list_default.csv) but with other content get no published figure."""
    out = tmp_path / "o"
    argv = ["sim", "--nodes", str(files["nodes"]), "--pods", str(files["pods"]), "--seeds", "42-51"]
    assert code_of([*argv, "--policies", "random,fgd", "--out", str(out), "--no-plots", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "fidelity:" not in text and "published" not in text
    rows = list(csv.DictReader((out / "fill_summary.csv").open()))
    assert rows and "published" not in rows[0]


@needs_data
def test_published_inputs_are_recognised_by_content() -> None:
    from simulator.sim_cli import is_published_experiment

    nodes = read_nodes(DATA / "openb_node_list_gpu_node.csv")
    tasks = [p.task for p in read_pods(DATA / "openb_pod_list_default.csv")]
    assert is_published_experiment(nodes, tasks)
    assert is_published_experiment(read_nodes(DATA / "openb_node_list_all_node.csv"), tasks)  # same GPU nodes
    assert not is_published_experiment(nodes, tasks[:-1] + tasks[:1])
    assert not is_published_experiment(nodes, [p.task for p in read_pods(DATA / "openb_pod_list_cpu050.csv")])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--nodes", "N", "--cluster", "C"], "--nodes and --cluster"),
        (["--nodes", "N", "--pods", "P", "--trace", "T"], "--pods and --trace"),
        (["--policies", "icl"], "--policies"),
    ],
    ids=["two-clusters", "two-workloads", "policies-in-both-modes"],
)
def test_inputs_that_would_be_ignored_are_errors(
    extra: list[str], message: str, files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    subst = {"N": files["nodes"], "C": files["cluster"], "P": files["pods"], "T": files["trace"]}
    argv = ["sim", *[str(subst.get(a, a)) for a in extra], "--out", str(tmp_path / "o"), "--no-plots"]
    if "--policies" in extra:
        argv += ["--mode", "both"]
    assert code_of(argv) == 2
    assert message in capsys.readouterr().err


def test_inputs_are_printed_with_the_clusters_they_ran_on(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace without --cluster runs on the built-in cluster, and the terminal says so."""
    argv = ["sim", "--mode", "time", "--trace", str(files["trace"]), "--policies", "icl"]
    assert code_of([*argv, "--out", str(tmp_path / "o"), "--no-plots", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Inputs\n") and "the built-in cluster (no --cluster)" in text


# ---- unknown columns and keys ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "reader", "expected"),
    [
        (
            "jobs.csv",
            "id,submit,duration,count,shap\nj,0,10,2,ring\n",
            read_jobs,
            r"jobs.csv:1: unknown column 'shap'; allowed: id, submit, .*on_preempt, runtime; did you mean 'shape'\?",
        ),
        (
            "jobs.json",
            '[{"id": "j", "submit": 0, "duration": 10, "count": 2, "gang_size": 2}]',
            read_jobs,
            r"jobs.json:1: job #0: unknown field 'gang_size'; allowed: .*; did you mean 'gang'\?",
        ),
        ("jobs.csv", "id,submit,duration,count\nj,0,10,2,9\n", read_jobs, r"jobs.csv:2: more cells than the header"),
        (
            "jobs.json",
            '{"jobs": [\n  {"id": "a", "submit": 0, "duration": 10, "count": 2},\n'
            '  {"id": "b", "submit": 0, "duration": 10,\n   "count": 2, "queu": "x"}\n]}\n',
            read_jobs,
            r"jobs.json:4: job #1: unknown field 'queu'; .*did you mean 'queue'\?",
        ),
        (
            "pods.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_mili\np,1,1,1,500\n",
            read_pods,
            r"pods.csv:1: unknown column 'gpu_mili'; allowed: name, .*; did you mean 'gpu_milli'\?",
        ),
        (
            "nodes.csv",
            "sn,cpu_milli,memory_mib,gpu,modle\nn,1,1,1,T4\n",
            read_nodes,
            r"nodes.csv:1: unknown column 'modle'; .*did you mean 'model'\?",
        ),
        (
            "c.yaml",
            "name: x\npools:\n  - name: a\n    topology: ring:4\n    modle: T4\n",
            load_cluster,
            r"c.yaml:5: pools\[0\]: unknown key 'modle'; allowed: name, count, .*; did you mean 'model'\?",
        ),
        (
            "c.yaml",
            "pools:\n  - name: a\n    topology: ring:4\n    link_domain:\n      kind: ring\n      dimz: [2]\n",
            load_cluster,
            r"c.yaml:6: pools\[0\].link_domain: unknown key 'dimz'; allowed: kind, dims; did you mean 'dims'\?",
        ),
        ("c.yaml", "pool:\n  - name: a\n", load_cluster, r"c.yaml:1: unknown key 'pool'; .*did you mean 'pools'\?"),
        (
            "c.yaml",
            "pools:\n  - name: a\n    topology: ring:4\n  - name: b\n    count: 0\n    topology: ring:4\n",
            load_cluster,
            r"c.yaml:5: pools\[1\].count: must be an integer >= 1, got 0",
        ),
    ],
    ids=[
        "csv-column",
        "json-field",
        "csv-extra-cell",
        "json-field-line",
        "pod-column",
        "node-column",
        "pool-key",
        "domain-key",
        "top-key",
        "line-of-value",
    ],
)
def test_unknown_columns_and_keys_name_file_line_and_what_is_allowed(
    name: str, text: str, reader: object, expected: str, tmp_path: Path
) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert callable(reader)
    with pytest.raises((JobFormatError, TraceError, SpecError), match=expected) as info:
        reader(path)
    assert str(info.value).count(str(path)) == 1


def test_a_typoed_column_stops_the_run_instead_of_making_every_job_any(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("id,submit,duration,count,shap\nj,0,10,4,ring\n")
    assert code_of(["sim", "--mode", "time", "--trace", str(trace), "--out", str(tmp_path / "o"), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"icl sim: {trace}:1: unknown column 'shap'") and "did you mean 'shape'?" in err


def test_a_bad_value_names_its_location_once(tmp_path: Path) -> None:
    """Was ``tr5.csv:2: tr5.csv:2: field 'duration' ...``."""
    trace = tmp_path / "tr5.csv"
    trace.write_text("id,submit,duration,count\nj,0,abc,2\n")
    with pytest.raises(JobFormatError) as info:
        read_jobs(trace)
    assert str(info.value) == f"{trace}:2: field 'duration' must be a number, got 'abc'"
    trace.write_text("id,submit,duration,count\nj,0,-1,2\n")
    with pytest.raises(JobFormatError) as info:
        read_jobs(trace)
    assert str(info.value) == f"{trace}:2: job 'j': duration must be > 0, got -1.0"


# ---- one exit code for every bad option --------------------------------------------------------

BAD_OPTIONS = [
    (["--seeds", "x"], "--seeds"),
    (["--seeds", "5-1"], "--seeds"),
    (["--seeds", ","], "--seeds"),
    (["--failures", "disk=0.1"], "--failures"),
    (["--failures", "device=abc"], "--failures"),
    (["--failures", "device=-1"], "--failures"),
    (["--weights", "a=0"], "--weights"),
    (["--weights", "a"], "--weights"),
    (["--weights", "nosuchqueue=2"], "--weights"),
    (["--jobs", "0"], "--jobs"),
    (["--tasks", "x"], "--tasks"),
    (["--seed", "x"], "--seed"),
    (["--inflation", "0.5"], "--inflation"),
    (["--repair", "0"], "--repair"),
    (["--backfill", "0"], "--backfill"),
    (["--invalid-slowdown", "0.5"], "--invalid-slowdown"),
    (["--interarrival", "0"], "--interarrival"),
    (["--interarrival", "nan"], "--interarrival"),
    (["--inflation", "inf"], "--inflation"),
    (["--policies", "icl-share"], "--policies"),
    (["--mode", "fast"], "--mode"),
    (["--cluster", "/nonexistent/c.yaml"], "/nonexistent/c.yaml"),
    (["--trace", "/nonexistent/t.csv"], "/nonexistent/t.csv"),
]


@pytest.mark.parametrize(("extra", "flag"), BAD_OPTIONS, ids=[" ".join(e) for e, _ in BAD_OPTIONS])
def test_every_bad_option_exits_2_with_one_message_naming_it(
    extra: list[str], flag: str, files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sim", "--mode", "time", "--out", str(tmp_path / "o"), "--no-plots", "--no-progress"]
    if "--trace" not in extra and "--cluster" not in extra:
        argv += ["--trace", str(files["trace"]), "--cluster", str(files["cluster"])]
    assert code_of([*argv, *extra]) == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


# ---- jobs that can never run -------------------------------------------------------------------


def test_jobs_that_can_never_run_are_counted_and_named_on_the_terminal(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "id,submit,duration,count,shape,gpu_milli,gpu_spec\n"
        "ok,0,60,2,ring,1000,\n"
        "huge,1,60,64,any,1000,\n"
        "share,2,60,1,any,500,\n"
        "a100,3,60,1,any,1000,A100\n"
    )
    argv = ["sim", "--mode", "time", "--cluster", str(files["cluster"]), "--trace", str(trace)]
    assert code_of([*argv, "--out", str(tmp_path / "o"), "--no-plots", "--no-progress"]) == 0
    text = capsys.readouterr().out
    never = text[text.index("Never placed") :]
    assert "time (kubelet, icl, icl-binpack): 3 of 4 jobs can never run" in never
    assert "huge: asks 64 devices; the largest node has 4" in never
    assert "a100: asks device model A100; the cluster's models are R, T4" in never
    assert "share: asks a fractional device share (gpu_milli 500)" in never
    rows = {r["job"]: r for r in csv.DictReader((tmp_path / "o" / "time_jobs.csv").open()) if r["policy"] == "icl"}
    assert rows["ok"]["rejected"] == "" and rows["huge"]["rejected"].startswith("asks 64 devices")


def test_fill_tasks_that_fit_no_node_are_counted_on_the_terminal(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = [Job(f"s{i}", 0.0, 1.0, 1, cpu_milli=1000) for i in range(20)] + [Job("huge", 0.0, 1.0, 64)]
    trace = tmp_path / "t.csv"
    write_jobs_csv(jobs, trace)
    argv = ["sim", "--mode", "fill", "--cluster", str(files["cluster"]), "--trace", str(trace), "--seeds", "1"]
    assert code_of([*argv, "--policies", "bestfit", "--out", str(tmp_path / "o"), "--no-plots"]) == 0
    text = capsys.readouterr().out
    assert "fill: 1 of 21 tasks fit on no node even with the cluster empty" in text
    assert "huge: asks 64 devices; the largest node has 4" in text


def test_topology_policies_honour_gpu_spec() -> None:
    from simulator.clusterspec import cluster_from_mapping

    spec = cluster_from_mapping(
        {
            "pools": [
                {"name": "r", "count": 2, "topology": "ring:4", "model": "R"},
                {"name": "t", "count": 2, "topology": "full:4", "model": "T4"},
            ]
        }
    )
    jobs = [Job(f"j{i}", float(i), 100.0, 2, gpu_spec=frozenset({"T4"})) for i in range(6)]
    for policy in ("kubelet", "icl", "icl-binpack"):
        res = run_time(spec, jobs, policy)
        assert all(r.end is not None for r in res.records)
    # where each ran: only T4 nodes (t-00, t-01); checked through the free devices of a one-job run
    from simulator.model_extender import ExtenderModel
    from simulator.model_kubelet import KubeletModel

    c = ExtenderModel(spec, PolicyName.ICL, None, None)
    c.queued(jobs[0])
    placed = c.place(jobs[0])
    assert placed is not None and {n for n, _ in placed[0].members} <= {"t-00", "t-01"}
    c = KubeletModel(spec)
    placed = c.place(jobs[0])
    assert placed is not None and {n for n, _ in placed[0].members} <= {"t-00", "t-01"}


# ---- every policy name a message suggests is a real one ----------------------------------------


def _suggested(message: str) -> list[str]:
    """The names listed after ``allowed:`` (to ``;``) and inside ``(...)`` lists of a message."""
    lists = re.findall(r"allowed: ([^;]+)", message) + re.findall(r"\(([^()]*,[^()]*)\)", message)
    return [name.strip().rstrip(".") for part in lists for name in part.split(",") if name.strip()]


def test_every_policy_name_a_message_suggests_runs(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("id,submit,duration,count,gpu_milli,gpu_spec\nshare,0,60,1,500,T4\nwhole,1,60,2,1000,\n")
    base = ["sim", "--cluster", str(files["cluster"]), "--trace", str(trace), "--no-plots", "--no-progress"]
    messages: dict[str, list[str]] = {}
    # the reason a fractional job gets under topology policies
    assert code_of([*base, "--mode", "time", "--policies", "icl", "--out", str(tmp_path / "o")]) == 0
    capsys.readouterr()
    rows = list(csv.DictReader((tmp_path / "o" / "time_jobs.csv").open()))
    messages["time"] = [next(r["rejected"] for r in rows if r["job"] == "share")]
    # unknown policy names in each mode
    for mode in ("fill", "time"):
        assert code_of([*base, "--mode", mode, "--policies", "icl-share", "--out", str(tmp_path / "x")]) == 2
        messages.setdefault(mode, []).append(capsys.readouterr().err)
    with pytest.raises(ValueError) as info:
        run_time(load_cluster(files["cluster"]), read_jobs(trace), "icl-share")
    messages["time"].append(str(info.value))
    for mode, texts in messages.items():
        names = [n for text in texts for n in _suggested(text)]
        assert names, texts
        assert "icl-share" not in names
        for name in set(names):
            out = tmp_path / f"run-{mode}-{name.replace(':', '-')}"
            argv = [*base, "--mode", mode, "--policies", name, "--out", str(out)]
            assert code_of([*argv, "--seeds", "1"] if mode == "fill" else argv) == 0, (mode, name, texts)
    assert set(SHARE_POLICIES) <= set(TIME_POLICIES)


# ---- progress off a terminal -------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_writes_plain_throttled_lines_when_stderr_is_not_a_terminal() -> None:
    from simulator.report import Progress

    clock = _Clock()
    log = io.StringIO()
    bar = Progress("time icl", stream=log, clock=clock, after=2.0, every=10.0)
    for done in range(0, 1001):
        clock.now = 3.0 + done * 0.001
        bar(done, 1000)
    bar(1000, 1000)
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert 2 <= len(lines) <= 11
    assert lines[-1].startswith("time icl: 1000/1000 (100%)")
    # a slow run still says something every `every` seconds
    slow = io.StringIO()
    bar = Progress("slow", stream=slow, clock=clock, after=0.0, every=10.0)
    for k in range(6):
        clock.now += 10.0
        bar(k, 1000)
    assert len(slow.getvalue().splitlines()) == 6


def test_progress_redraws_in_place_on_a_terminal() -> None:
    from simulator.report import Progress

    clock = _Clock()
    tty = _Tty()
    bar = Progress("fill x3", stream=tty, clock=clock, after=0.0)
    for done in range(4):
        bar(done, 3)
    assert tty.getvalue().count("\r") == 4 and tty.getvalue().endswith("\n")


# ---- the demo and the report -------------------------------------------------------------------


def test_demo_draws_every_topology_its_summary_lists(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--no-sim"]) == 0
    text = capsys.readouterr().out
    summary = text[text.index("summary (") :]
    listed = {line.split()[0] for line in summary.splitlines()[1:] if line.strip()}
    drawn = set(re.findall(r"^\[([^\]]+)\] policy", text, flags=re.M))
    assert listed and listed == drawn


def test_report_records_command_and_version_and_drops_an_empty_published_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from importlib.metadata import version

    out = tmp_path / "o"
    argv = ["sim", "--mode", "fill", "--tasks", "40", "--seeds", "1", "--policies", "bestfit,icl", "--no-progress"]
    assert code_of([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "published" not in text
    html = (out / "report.html").read_text()
    command = f"icl sim --mode fill --tasks 40 --policies bestfit,icl --seeds 1 --out {out} --no-progress"
    assert f"<code>{command}</code>" in html
    assert f"kube-icl {version('kube-icl')}" in html
    assert "published" not in html
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["command"] == command and metrics["version"] == version("kube-icl")


def test_the_documented_cluster_spec_and_example_files_load() -> None:
    root = Path(__file__).resolve().parents[1]
    doc = (root / "docs" / "simulator.md").read_text()
    block = doc[doc.index("```yaml\n") + len("```yaml\n") :]
    block = block[: block.index("```")]
    from simulator.clusterspec import cluster_from_mapping

    documented = cluster_from_mapping(yaml.safe_load(block))
    example = load_cluster(root / "examples" / "sim" / "cluster.yaml")
    assert [n.name for n in documented.nodes] == [n.name for n in example.nodes if n.pool != "infer"]
    assert {j.id for j in read_jobs(root / "examples" / "sim" / "jobs.csv")} == {"train-a", "infer-b"}
