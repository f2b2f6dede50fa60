"""What a thread gets on each kernel backend, with the reason wherever a backend lacks it.

One table, three readers: `slackinterp doctor` prints the column of the backend it finds, the
bot logs what its backend lacks at start (runtime.py), and docs/deployment.md holds the same
table as Markdown (tests/test_backend_features.py keeps them equal). Each row names the
capability of `Kernel`/`KernelBackend` (kernels/backend.py) or the feature behind it, so a
capability a backend gains or loses is a change here, seen in all three places.
"""

from __future__ import annotations

from dataclasses import dataclass

LOCAL, GATEWAY = "local", "gateway"


@dataclass(frozen=True)
class Feature:
    name: str
    local: str  # "✓", "✗" or "✓ <how>"
    gateway: str
    why: str = ""  # how it works, or why not, where the backends differ

    def on(self, backend: str) -> str:
        return self.local if backend == LOCAL else self.gateway

    def works(self, backend: str) -> bool:
        return self.on(backend).startswith("✓")


FEATURES = (
    Feature(
        "`sql()` and `%%sql`",
        "✓ sandboxed kernels (data socket)",
        "✓ the kernel's own connection",
        "a comm answered on a kernel subshell (ipykernel ≥ 7 in the kernel's environment); "
        "the thread is the connection's, so kernels that can reach each other's connections "
        "must be kept apart by the deployment (SECURITY.md §12)",
    ),
    Feature(
        "CPU-seconds and peak memory per cell (`resources`)",
        "✓ cgroup or /proc",
        "✓ read by the kernel",
        "getrusage around each cell: the kernel's threads and the children it waited for; "
        "what the kernel says, so its code could misstate it (no cap depends on it)",
    ),
    Feature("Usage footer, caps, `@interp usage`", "✓", "✓"),
    Feature("`input()` and `getpass()`", "✓", "✓", "the stdin channel, on every backend"),
    Feature(
        "Plots; Plotly, Altair and Bokeh as PNGs",
        "✓",
        "✓",
        "rendered on the bot's side; the kernel's environment must have the libraries",
    ),
    Feature(
        "Snapshots, restore, `undo`, `fork` (`copy_thread`)",
        "✓",
        "✓",
        "the kernel reads and writes its own snapshots; a fork is copied on the gateway's disk",
    ),
    Feature(
        "Files a cell wrote, after its kernel died (`files_outlive_it`)",
        "✓",
        "✗",
        "the files live with the kernel and are reached through it",
    ),
    Feature(
        "`@interp files` of a thread without a live kernel (`workdir_files`)",
        "✓",
        "✓ starts a kernel",
        "the working directory is on the gateway's disk",
    ),
    Feature(
        "Network policy: `SLACKINTERP_NETWORK`, per-channel rules, secrets, blocked-request "
        "notes (`serve_thread`, `take_blocked`)",
        "✓ sandbox and egress proxy",
        "✓ when confined, the proxy's remote door",
        "each kernel gets proxy credentials of its own (KERNEL_* environment, revoked when it "
        "ends); the bot probes at start whether kernels are confined (the shipped kernelspec, "
        "or a NetworkPolicy on kernel pods) and refuses allowlist mode when not (SECURITY.md §9)",
    ),
    Feature(
        "Per-thread sandbox: files, processes and sockets of other threads hidden",
        "✓ bubblewrap",
        "✓ with the shipped kernelspec or one pod per kernel",
        "`slackinterp kernelspec install` on a gateway host runs each kernel in the local "
        "kernels' sandbox; on Kubernetes, Enterprise Gateway gives each kernel its own pod",
    ),
    Feature(
        "Memory and process limits per kernel",
        "✓ RLIMIT_AS, pids cgroup",
        "✓ with the shipped kernelspec or pod resources",
        "the kernelspec's launcher applies the local kernels' limits; pods get theirs from "
        "the Helm values",
    ),
    Feature(
        "A cell's first moments at the bot's priority (`hurry`)",
        "✓ when the bot may renice",
        "✗",
        "the kernel's host schedules it",
    ),
    Feature(
        "Kernel start from a warm template (`SLACKINTERP_KERNEL_START`)",
        "✓",
        "✗ warm pool only",
        "the gateway starts each kernel itself",
    ),
    Feature(
        "The model told which packages kernels can import",
        "✓",
        "✗ a general sentence",
        "the kernel's environment is the deployment's image",
    ),
    Feature(
        "`@interp status` kernel memory (`pid`)",
        "✓",
        "✗",
        "the process is the gateway's (each cell's peak is still recorded)",
    ),
    Feature(
        "Kernels of a crashed bot cleaned up at start (`cleanup_orphans`)",
        "✓",
        "✗ the gateway's culler",
        "set its cull_idle_timeout above SLACKINTERP_IDLE_TIMEOUT",
    ),
    Feature(
        "Several bot replicas serving one thread (`shared_kernels`, `attach`)",
        "✗",
        "✓ with PostgreSQL",
        "replicas attach to each other's kernels on the gateway",
    ),
)


def missing(backend: str) -> list[Feature]:
    """What `backend` does not give (said at start and by doctor)."""
    return [f for f in FEATURES if not f.works(backend)]


def lines(backend: str) -> list[str]:
    """The column of one backend, one line a feature, for doctor."""
    found = []
    for feature in FEATURES:
        cell = feature.on(backend)
        parts = [cell[1:].strip()]
        if backend == GATEWAY:  # the reasons are about the gateway's column
            parts.append(feature.why)
        detail = "; ".join(part for part in parts if part)
        found.append(f"  {cell[:1]} {feature.name}" + (f": {detail}" if detail else ""))
    return found


def markdown() -> str:
    """The table as docs/deployment.md holds it."""
    rows = ["| feature | local kernels | gateway kernels | how, or why not |", "|---|---|---|---|"]
    rows += [f"| {f.name} | {f.local} | {f.gateway} | {f.why} |" for f in FEATURES]
    return "\n".join(rows)
