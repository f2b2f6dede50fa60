"""Which analysis packages the kernels can import, read once from the kernels' own Python, so
the model is told what is there rather than a fixed list (and does not try `pip install`)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys

from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

log = logging.getLogger(__name__)

# Distributions worth naming to the model, in the order it reads them.
NOTABLE = (
    "numpy",
    "pandas",
    "matplotlib",
    "scipy",
    "seaborn",
    "scikit-learn",
    "statsmodels",
    "pyarrow",
    "openpyxl",
    "xlrd",
    "polars",
    "duckdb",
    "plotly",
    "sympy",
    "networkx",
    "pillow",
    "beautifulsoup4",
    "requests",
)
PROBE = (
    "import importlib.metadata as m, json, sys\n"
    "found = []\n"
    "for name in json.loads(sys.argv[1]):\n"
    "    try:\n"
    "        found.append(f'{name} {m.version(name)}')\n"
    "    except m.PackageNotFoundError:\n"
    "        pass\n"
    "print(json.dumps(found))\n"
)
TIMEOUT = 15.0


def kernel_python(kernel_name: str) -> str | None:
    """The interpreter a local kernel spec runs (jupyter_client's own rule for `python`)."""
    try:
        argv = KernelSpecManager().get_kernel_spec(kernel_name).argv
    except (NoSuchKernel, OSError, ValueError):
        return None
    if not argv:
        return None
    major, minor = sys.version_info[:2]
    if argv[0] in {"python", f"python{major}", f"python{major}.{minor}"}:
        return sys.executable
    return argv[0]


async def installed(python: str, names: tuple[str, ...] = NOTABLE) -> list[str]:
    """`name version` for each of `names` the interpreter has; [] when it cannot tell."""
    try:
        proc = await asyncio.create_subprocess_exec(
            python,
            "-I",  # isolated: neither the bot's environment nor its directory leaks in
            "-c",
            PROBE,
            json.dumps(list(names)),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )
    except OSError as exc:
        log.warning("kernel.packages_unknown python=%s error=%s", python, exc.strerror)
        return []
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        log.warning("kernel.packages_unknown python=%s error=timeout", python)
        return []
    try:
        found = json.loads(out.decode() or "[]")
    except ValueError:
        return []
    return [str(item) for item in found if isinstance(item, str)]
