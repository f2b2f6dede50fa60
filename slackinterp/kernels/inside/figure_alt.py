"""Alt text for plots: the figure's title (suptitle, else the first axes title) goes with each
inline matplotlib image as display metadata `alt`, which the renderer gives Slack.

matplotlib's inline backend sends a figure's PNG with no hint of what it shows. This hook,
run once at kernel start (as an exec_lines entry, so no file is written anywhere), wraps the
backend's metadata function when a cell first imports the backend (an import hook that
removes itself); it imports nothing heavy, so a kernel's start-up does not change.
"""

from __future__ import annotations

HOOK = """\
def __si_figure_alt():
    import sys
    import importlib.util
    name = "matplotlib_inline.backend_inline"
    def patch(module):
        plain = module._fetch_figure_metadata
        def fetch(fig):
            meta = plain(fig) or {}
            title = ""
            try:
                if getattr(fig, "_suptitle", None) is not None:
                    title = fig._suptitle.get_text()
                if not title:
                    title = next((ax.get_title() for ax in fig.axes if ax.get_title()), "")
            except Exception:
                title = ""
            if title.strip():
                meta = dict(meta, alt=title.strip()[:900])
            return meta or None
        module._fetch_figure_metadata = fetch
    if name in sys.modules:
        patch(sys.modules[name])
        return
    class Finder:
        def find_spec(self, fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module
            def exec_module(module):
                run(module)
                patch(module)
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, Finder())
__si_figure_alt()
del __si_figure_alt
"""


def exec_line() -> str:
    """The hook as one exec_lines entry (a kernel's command line holds one line per item)."""
    return f"exec({HOOK!r})"
