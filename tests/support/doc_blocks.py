"""The command lines of the README's and docs' fenced blocks, as a reader would type them.

Tests use it two ways: every `pulsar-autoscale` command line is parsed by the real CLI parser (a doc that
shows a flag the CLI does not take fails in the unit tier), and the blocks that make a whole example are run
verbatim against real brokers (the system tier).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_OPERATORS = {"|", "||", "&", "&&", ";", "(", ")", ">", ">>", "<", "2>&1", "$("}


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # the line of the opening fence
    info: str  # the fence's language tag
    text: str

    def where(self, offset: int = 0) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line + 1 + offset}"


@dataclass(frozen=True)
class Command:
    """One simple command of a block: argv after `pulsar-autoscale` (or the program for others)."""

    where: str
    program: str
    argv: list[str]


def blocks(doc: Path) -> list[Block]:
    text = doc.read_text()
    return [
        Block(doc, text.count("\n", 0, m.start()), m.group(1), m.group(2))
        for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)
    ]


def block(doc: str, heading: str) -> str:
    """The first fenced block after `heading` in `doc` (relative to the checkout)."""
    text = (ROOT / doc).read_text()
    section = text[text.index(heading) :]
    return re.search(r"```\n(.*?)```", section, re.S).group(1)


def _logical_lines(b: Block) -> list[tuple[int, str]]:
    """Lines with continuations joined and heredoc bodies dropped; a block of `$ ` prompts keeps only those."""
    raw = b.text.splitlines()
    prompted = any(line.startswith("$ ") for line in raw)
    out, heredoc_end, pending, start = [], None, "", 0
    for i, line in enumerate(raw):
        if heredoc_end is not None:
            heredoc_end = None if line.strip() == heredoc_end else heredoc_end
            continue
        if prompted and not pending:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if not pending:
            start = i
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line, pending = pending + line, ""
        marker = re.search(r"<<-?'?(\w+)'?", line)
        if marker:
            heredoc_end = marker.group(1)
        out.append((start, line))
    return out


def commands(b: Block) -> list[Command]:
    """The simple commands of a shell block, split at pipes, lists and redirections."""
    if b.info not in ("", "bash", "sh", "shell"):
        return []
    found, variables = [], {}
    for offset, line in _logical_lines(b):
        line = re.sub(r"(?<=\s)\d?>&\d|(?<=\s)\d(?=>)", " ", line)  # 2>&1, 2>/dev/null: redirections
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError:  # an unbalanced quote: not a command line (output, a synopsis)
            continue
        words: list[str] = []
        for token in [*tokens, ";"]:
            if token in SHELL_OPERATORS or set(token) <= set(";&|()<>"):
                assignments = []
                while words and re.fullmatch(r"\w+=.*", words[0]):  # VAR=value before the program
                    assignments.append(words.pop(0).split("=", 1))
                if words:
                    argv = [w for word in words[1:] for w in _expanded(word, variables)]
                    found.append(Command(b.where(offset), words[0], argv))
                    if words[0] == "for" and argv[1:2] == ["in"] and len(argv) > 2:
                        variables[argv[0]] = argv[2]  # the loop's first value stands for all
                else:
                    variables.update(assignments)  # a line of assignments only: the block's variables
                words = []
            elif words and words[-1] in (">", ">>"):
                continue
            else:
                words.append(token)
    return found


def _expanded(word: str, variables: dict[str, str]) -> list[str]:
    """`$AUTH` as the shell splits it; `675$n` with the value in place."""
    if word.startswith("$") and word[1:] in variables:
        return shlex.split(variables[word[1:]])
    return [re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), m.group(0)), word)]


def documented_commands() -> list[Command]:
    return [c for doc in DOCS for b in blocks(doc) for c in commands(b)]


def is_synopsis(command: Command) -> bool:
    """A usage line (`[--port P]`, `ACTION ...`), not a command to type as it is."""
    return any(a.startswith("[") or a in ("...", "ACTION") for a in command.argv)


def run_script(script: str, cwd: Path, env: dict, out_dir: Path, timeout_s: float = 240) -> str:
    """Run a block with bash -e; stdout and stderr together, or a failure showing both when it exits non-zero."""
    out_dir.mkdir()
    # Its own process group: whatever the block started in the background goes when the run ends.
    # Output to files: background jobs would hold a pipe open after the shell is done.
    with open(out_dir / "out", "w") as out_f, open(out_dir / "err", "w") as err_f:
        proc = subprocess.Popen(
            ["bash", "-e", "-c", script], cwd=cwd, env=env, stdout=out_f, stderr=err_f, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=timeout_s)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    out, err = (out_dir / "out").read_text(), (out_dir / "err").read_text()
    assert rc == 0, f"the block failed (rc {rc}):\n{out}\n{err[-3000:]}"
    return out + err


def policy_example(tmp_path: Path) -> str:
    """docs/policies.md's worked example, copied into a file as a reader would."""
    code = re.findall(
        r"```python\n(.*?)```", (ROOT / "docs" / "policies.md").read_text().split("## A worked example", 1)[1], re.S
    )[0]
    path = tmp_path / "target_utilization.py"
    path.write_text(code)
    return str(path)
