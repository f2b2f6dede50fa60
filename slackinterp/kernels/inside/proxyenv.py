"""A remote kernel's way to the egress proxy (egress/remote.py), set up by the bot after the
kernel starts and again after each restart: the same code on any kernelspec and image.

The kernel's own KERNEL_SLACKINTERP_PROXY (its credentials, given at start) becomes the proxy
variables every client reads, in os.environ so `%pip` and `!curl` inherit them. Under the
shipped kernelspec the launcher also sets SLACKINTERP_EGRESS_URL: the same credentials at the
in-sandbox relay (127.0.0.1:3128), the only way out of the kernel's network namespace. With
secrets bound, KERNEL_SLACKINTERP_CA (the bot's CA) is added to the system's roots in a file
of the kernel's own, which every client is pointed at.

Only definitions at import (kernels/inside/__init__.py): the bot calls `setup`.
"""


def setup(proxy_names: list[str], no_proxy: str, trust_names: list[str]) -> bool:
    import os
    import ssl
    import tempfile

    url = os.environ.get("SLACKINTERP_EGRESS_URL") or os.environ.get("KERNEL_SLACKINTERP_PROXY")
    if not url:
        return False
    for name in proxy_names:
        os.environ[name] = url
    for name in ("NO_PROXY", "no_proxy"):
        os.environ[name] = no_proxy
    os.environ["NODE_USE_ENV_PROXY"] = "1"
    ca = os.environ.get("KERNEL_SLACKINTERP_CA")
    if ca:
        roots = b""
        paths = ssl.get_default_verify_paths()
        for candidate in (paths.cafile, paths.openssl_cafile):
            if candidate and os.path.isfile(candidate):
                with open(candidate, "rb") as handle:
                    roots = handle.read()
                break
        if not roots:
            try:
                import certifi

                with open(certifi.where(), "rb") as handle:
                    roots = handle.read()
            except (ImportError, OSError):
                pass
        fd, path = tempfile.mkstemp(prefix="slackinterp-ca-", suffix=".pem")
        with os.fdopen(fd, "wb") as handle:
            handle.write(ca.encode("ascii") + b"\n" + roots)
        for name in trust_names:
            os.environ[name] = path
    return True
