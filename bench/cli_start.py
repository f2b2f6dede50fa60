"""Benchmark: how fast the command line answers when it has nothing to start.

Run by hand from the repository root (not a test; ~20 s idle, more on a busy machine):

    .venv/bin/python -m bench.cli_start [--runs 7]

Each case is the real `python -m slackinterp …` process, run --runs times, interleaved with
the others so that load changes hit every case alike, in an empty folder (no .env) with no
Slack or OpenAI variables. Printed: the median and the fastest wall time of each, and the
ratio of the median to `python -c pass` (the interpreter's own start) measured in the same run.

    python -c pass             the baseline
    --version
    run, no token              "SLACK_BOT_TOKEN is not set", exit 2
    run, malformed token       "SLACK_BOT_TOKEN should start with xoxb-", exit 2
    manifest                   the YAML on stdout
    import the bot             `import slackinterp.slack.bot`: what `run` imported before it
                               checked a token until the settings moved ahead of it (for
                               comparison; the bot's own start pays it after the check)

Target: `run` with a missing or malformed token and `manifest` answer within 1 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

CASES: dict[str, tuple[list[str], dict[str, str], int]] = {
    "python -c pass": (["-c", "pass"], {}, 0),
    "--version": (["-m", "slackinterp", "--version"], {}, 0),
    "run, no token": (["-m", "slackinterp", "run"], {}, 2),
    "run, malformed token": (
        ["-m", "slackinterp", "run"],
        {"SLACK_BOT_TOKEN": "xapp-not-a-bot-token", "SLACK_APP_TOKEN": "xapp-1"},
        2,
    ),
    "manifest": (["-m", "slackinterp", "manifest"], {}, 0),
    "import the bot": (["-c", "import slackinterp.slack.bot"], {}, 0),
}
TARGET_SECONDS = 1.0
TARGETED = ("run, no token", "run, malformed token", "manifest")


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK", "OPENAI"))}
    env.update(extra)
    return env


def once(args: list[str], extra: dict[str, str], expect: int, cwd: str) -> float:
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *args], env=clean_env(extra), cwd=cwd, capture_output=True, check=False
    )
    took = time.perf_counter() - began
    if done.returncode != expect:
        raise SystemExit(
            f"{args}: exit {done.returncode}, expected {expect}\n{done.stderr.decode()[-2000:]}"
        )
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    times: dict[str, list[float]] = {name: [] for name in CASES}
    with tempfile.TemporaryDirectory() as cwd:
        for args, extra, expect in CASES.values():  # warm the file cache once
            once(args, extra, expect, cwd)
        for _ in range(runs):
            for name, (args, extra, expect) in CASES.items():
                times[name].append(once(args, extra, expect, cwd))
    load = os.getloadavg()[0]
    print(f"{runs} runs each, interleaved; load average {load:.1f} on {os.cpu_count()} CPUs")
    base = statistics.median(times["python -c pass"])
    print(f"{'case':<24}{'median':>10}{'fastest':>10}{'x pass':>9}")
    for name, values in times.items():
        median = statistics.median(values)
        mark = ""
        if name in TARGETED:
            mark = "  ok" if median <= TARGET_SECONDS else f"  over {TARGET_SECONDS:g} s"
        print(f"{name:<24}{median:>9.3f}s{min(values):>9.3f}s{median / base:>8.1f}x{mark}")


if __name__ == "__main__":
    main()
