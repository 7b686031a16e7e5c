"""The documentation against the code, without running a job: every page reachable, every command
line it shows accepted by the real parser of its entry point, every file it names present, the
module map equal to the tree, the README a front door. (tests/integration/test_docs_commands.py
runs the commands; tests/integration/test_docs_site.py builds the site and opens it in a browser.)
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from tests import pages
from tests.pages import DOCS, ROOT

sys.path.insert(0, str(DOCS / "hooks"))
import commandlines  # noqa: E402  (docs/hooks/commandlines.py: the parsers the CLI reference is rendered from)

PAGES = pages.pages()
PAGE_IDS = [pages.name(p) for p in PAGES]
README = (ROOT / "README.md").read_text()


def nav_pages() -> list[str]:
    yaml = pytest.importorskip("yaml", reason="PyYAML comes with the docs extra (make docs)")

    class Loader(yaml.SafeLoader):  # mkdocs.yml may hold !!python tags MkDocs resolves; none are read here
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)
    found = []

    def walk(entry):
        if isinstance(entry, str):
            found.append(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                walk(value)
        elif isinstance(entry, list):
            for value in entry:
                walk(value)

    walk(config["nav"])
    return found


def test_every_page_is_in_the_navigation_and_every_entry_is_a_page():
    nav = nav_pages()
    files = {str(p.relative_to(DOCS)) for p in PAGES if p.is_relative_to(DOCS)}
    assert sorted(files - set(nav)) == [], "pages no menu reaches: add them to nav in mkdocs.yml"
    assert sorted(set(nav) - files) == []
    assert len(nav) == len(set(nav)), "a page listed twice"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_no_page_is_a_wall_of_text(page):
    limit = 250 if page.name == "README.md" else 400
    assert len(page.read_text().splitlines()) <= limit, f"{pages.name(page)}: split it, or move detail to a page"


def all_commands(page) -> list[tuple[str, bool]]:
    """(command line, whether it is inline in the prose) for everything the page shows a user typing."""
    out = [(c, False) for b in pages.blocks(page) for c in b.commands()]
    out += [(c, True) for c in pages.inline_commands(page)]
    for block in pages.blocks(page):
        if block.lang == "python" and block.lines and block.lines[0].startswith("# "):
            out.append((block.lines[0][2:], False))  # the launch line
    return out


MAKE_COMMAND = re.compile(r"^(sudo )?make( [a-z][\w-]*| [A-Z_]+=\S+)*$")


def make_refusal(command: str) -> str | None:
    """Whether make knows the targets and takes the variables: a dry run (-n) of the line."""
    words = shlex.split(command, comments=True)
    words = words[1:] if words[0] == "sudo" else words
    done = subprocess.run(["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60)
    return None if done.returncode == 0 else done.stderr.strip()[-500:]


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_command_shown_is_accepted_by_the_real_parser(page):
    # Slow blocks are not run by make test; their flags are checked here all the same, so a flag
    # that does not exist (bench validate --steps) cannot hide in a command nobody runs.
    refused = []
    for command, inline in all_commands(page):
        if MAKE_COMMAND.match(command):
            why = make_refusal(command)
        elif command.split()[0] == "make":
            continue  # inline prose such as make(strategy, ...), not a command line
        else:
            try:
                why = commandlines.refusal(commandlines.parse_command(command))
            except ValueError as e:
                why = str(e)
        if why and not (inline and "arguments are required" in why):  # prose may name a command: `mpi-sgd faults`
            refused.append(f"{command}\n    {why}")
    assert not refused, "\n".join(refused)


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_file_named_exists(page):
    missing = [f for f in pages.named_files(page) if not (ROOT / f).exists()]
    assert not missing, f"{pages.name(page)} names {missing}"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_block_is_marked_in_a_way_the_tests_read(page):
    for block in pages.blocks(page):
        assert block.lang in ("bash", "text", "python", ""), f"{block.id}: fence ```{block.lang}: use bash for commands"
        if "slow" in block.marks:
            assert len(block.slow) > 10, f"{block.id}: say why it is slow"
        if "output" in block.marks:
            assert block.marks["output"] == "exact" and block.is_session, block.id
        if block.lang == "python":
            assert re.match(r"# (mpiexec -n \d+ )?python \S+\.py$", block.lines[0]), f"{block.id}: no launch line"
        int(block.marks.get("exit", "0"))
        if any("docs-serve" in c for c in block.commands()):
            assert "serves" in block.marks, f"{block.id}: a server never exits: mark it <!-- serves: URL -->"


NEEDS = {  # what a command needs that make test's machine may lack: such a block must be slow
    "two hosts": re.compile(r"-hosts a,b|-f hostfiles/hydra|--hostfile hostfiles/|doctor -hosts"),
    "root": re.compile(r"^sudo |netns"),
    "Docker": re.compile(r"docker"),
    "a GPU": re.compile(r"--device cuda|nccl|test-gpu"),
    "a whole test suite": re.compile(r"^(sudo )?make test\b|pytest"),
}


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_blocks_that_need_more_than_this_machine_are_marked_slow(page):
    for block in pages.blocks(page):
        for command in block.commands():
            for need, pattern in NEEDS.items():
                if pattern.search(command) and not block.slow:
                    pytest.fail(f"{block.id}: `{command}` needs {need}: mark the block <!-- slow: why -->")


def test_the_module_map_is_the_tree():
    text = (DOCS / "contributing" / "architecture.md").read_text()
    tree_block = re.search(r"```text\n(mpi_sgd/\n.*?)```", text, re.S).group(1)
    named, stack = set(), []
    for line in tree_block.splitlines():
        word = line.split()[0] if line.strip() else ""
        indent = len(line) - len(line.lstrip())
        if not word.endswith((".py", "/")) or indent >= 20:
            continue  # a description's second line
        stack = stack[: indent // 2] + [word]
        if stack[0] != "mpi_sgd/":
            break  # examples/, tests/ ... after the package
        named.add("".join(stack))
    package = ROOT / "mpi_sgd"
    tree = {str(p.relative_to(ROOT)) for p in package.rglob("*.py") if p.name != "__init__.py"}
    tree |= {f"{p.relative_to(ROOT)}/" for p in package.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    assert sorted(tree - named) == [], "modules missing from the map in docs/contributing/architecture.md"
    assert sorted(n for n in named - tree if not n.endswith(("__init__.py", "mpi_sgd/"))) == [], "not in the tree"


def test_every_entry_point_is_in_the_cli_reference():
    markers = set(re.findall(r"<!-- cli: (.+?) -->", "".join(p.read_text() for p in (DOCS / "reference").glob("*.md"))))
    assert markers == set(commandlines.entries())
    runnable = set(commandlines.runnable_modules())
    assert runnable == set(commandlines.MODULES) | set(commandlines.INTERNAL), "a new `python -m` module: list it"


def test_the_cli_reference_renders_every_option_of_the_trainer():
    section = commandlines.markdown(commandlines.parser_of("examples/sync_sgd.py"), "examples/sync_sgd.py")
    for flag in ("--strategy", "--bucket-mb", "--checkpoint", "--stall-timeout", "--zero", "--val-fraction"):
        assert f"`{flag}" in section, flag


def test_launcher_options_are_read_not_guessed():
    cmd = commandlines.parse_command("sudo MPI_SGD_FAULT=1:3:nan mpiexec -n 2 -genv A b python examples/x.py --y 1 # z")
    assert cmd.sudo and cmd.launcher == "mpiexec" and cmd.program == ["python", "examples/x.py", "--y", "1"]
    with pytest.raises(ValueError, match="add it to"):
        commandlines.parse_command("mpiexec --no-such-option 2 python examples/x.py")
    wrapped = commandlines.parse_command(
        'python -m mpi_sgd.cluster.netns -- env M="mpiexec -hosts a,b" mpi-sgd bench validate --steps 20'
    )
    assert "unrecognized arguments: --steps 20" in commandlines.refusal(wrapped)  # the flag that hid here


def test_the_output_matcher_reads_numbers_ellipses_and_words():
    shown = ["epoch 0  loss 2.17", "...", "200 steps; T_sync 8.26 ms"]
    assert pages.output_matches(shown, "epoch 0 loss 1.5\nepoch 1 loss 1\n200 steps; T_sync 1 ms\n")
    assert not pages.output_matches(shown, "epoch 0 loss 1.5\n200 steps\n")  # words differ
    assert not pages.output_matches(["a 1"], "a 2", exact=True) and pages.output_matches(["a 1"], "a 2")
    assert not pages.output_matches(["a", "b"], "a\nprocesses: x\nb")  # a line the page lacks


# -- the README: a front door --------------------------------------------------------------------------
def test_the_readme_keeps_the_setup_contract():
    for command in (
        "make demo",
        "make test",
        "mpiexec -n 4 -hosts a,b python examples/sync_sgd.py",
        "make docker-cluster",
        "mpirun -n 2 pytest --with-mpi",
        "examples/speedup.py",
        "make docs",
    ):
        assert command in README, command
    assert re.search(r"CPU build.*\b192 MB\b", README, re.S) and "2.7 GB" in README  # honest download sizes
    assert "CUDA build" in README


def test_the_readme_carries_no_figures_or_measurements():
    assert "<!-- figure" not in README and "![" not in README and ".png" not in README
    assert "measured here" not in README.lower()


def test_every_docs_link_in_the_readme_is_a_page():
    for target in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / target).exists(), target


FIGURES = {"ring-allreduce", "timeline-bucketed", "allreduce-sizes", "zero-memory", "pipeline-schedules"}
FIGURES |= {"staleness", "speedup", "time-to-target"}


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_figure_placeholders_name_the_figures_that_are_drawn(page):
    for figure in re.findall(r"^<!-- figure: (\S+) -->$", page.read_text(), re.M):
        assert figure in FIGURES, f"{pages.name(page)}: no figure {figure!r} is drawn"


# -- figures on the pages that the code decides --------------------------------------------------------
def test_the_netns_run_figures_follow_from_the_trainer_defaults():
    from mpi_sgd.config import TrainConfig
    from mpi_sgd.data import prepare
    from mpi_sgd.models import build_model

    cfg = TrainConfig()
    train, _ = prepare(cfg.dataset, cfg.seed, cfg.val_fraction)
    ranks = 4  # mpiexec -n 4 -hosts a,b
    steps = len(train) // (ranks * cfg.batch_size) * cfg.epochs
    model = build_model(cfg.model, tuple(train.x.shape[1:]), train.num_outputs)
    params = sum(p.numel() for p in model.parameters())
    floor_mb = steps * params * 4 / 1e6
    page = (DOCS / "use" / "test-clusters.md").read_text()
    assert (steps, params) == (96, 85_002)
    assert f"{steps} steps" in page and f"{params:,} parameters" in page and f"= {floor_mb:.1f} MB each way" in page


def test_the_server_death_messages_are_the_ones_the_worker_prints():
    source = (ROOT / "mpi_sgd" / "paramserver" / "worker.py").read_text()
    page = " ".join((DOCS / "use" / "parameter-server.md").read_text().split())
    templates = re.findall(r'ServerLost\(\s*((?:f"[^"]*"\s*)+)\)', source)
    quoted = [t for t in templates if "no word from" in t or "middle of a message" in t]
    assert len(quoted) == 2, templates  # the silent server, and the one that died half-way through a reply
    for template in quoted:
        text = "".join(re.findall(r'f"([^"]*)"', template))
        text = text.replace("{self.comm.rank}", "1").replace("{s}", "0").replace("{server}", "0")
        text = text.replace("{timeout:g}", "5")
        assert text in page, text
