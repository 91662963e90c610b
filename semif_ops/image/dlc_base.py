"""What the AWS llama.cpp DLC's runtime stage has, and nothing more: one description for two users.

The DLC's runtime stage is the Amazon Linux 2023 *container* image plus ``libgomp libcurl curl-minimal
openblas shadow-utils python3.12 python3.12-pip`` (``python3``/``python`` point at 3.12) and llama.cpp's
``build/bin`` copied to ``/opt/llama.cpp/bin``; it runs as root with ``ENTRYPOINT ["/usr/bin/serve"]``. The
AL2023 container image deliberately leaves out findutils (``find``, ``xargs``), ``which``, ``tar``,
``gzip``, procps and perl.

- ``tests/image/dlc_standin.py`` strips its Debian root filesystem down to :data:`COMMANDS` on ``PATH``, so a
  command the real base lacks fails in the stand-in as it would on AWS.
- ``semif-ops image check`` fails when a Dockerfile ``RUN`` line or a ``docker/*.sh`` script calls a
  command outside :data:`COMMANDS`, the shell's builtins, or this project's own files.
"""

from __future__ import annotations

# coreutils-single (the whole GNU coreutils set, one multi-call binary on AL2023)
COREUTILS = frozenset(
    """
    [ arch b2sum base32 base64 basename basenc cat chcon chgrp chmod chown chroot cksum comm cp csplit cut
    date dd df dir dircolors dirname du echo env expand expr factor false fmt fold groups head hostid id
    install join link ln logname ls md5sum mkdir mkfifo mknod mktemp mv nice nl nohup nproc numfmt od paste
    pathchk pinky pr printenv printf ptx pwd readlink realpath rm rmdir runcon seq sha1sum sha224sum
    sha256sum sha384sum sha512sum shred shuf sleep sort split stat stdbuf stty sum sync tac tail tee test
    timeout touch tr true truncate tsort tty uname unexpand uniq unlink users vdir wc who whoami yes
    """.split()
)

# The rest of the AL2023 container image's userland that a build step could reasonably call.
AL2023_OTHER = frozenset(
    """
    bash sh grep egrep fgrep sed gawk awk curl getent ldd ldconfig iconv locale
    alternatives update-alternatives rpm dnf yum
    """.split()
)

# Added by the DLC's runtime stage: shadow-utils and Python 3.12 with pip.
DLC_ADDED = frozenset(
    """
    useradd userdel usermod groupadd groupdel groupmod chpasswd chage newusers pwck grpck
    python python3 pip pip3
    """.split()
)

COMMANDS = COREUTILS | AL2023_OTHER | DLC_ADDED

# Well-known tools the real base does not have (named in messages and tested as absent from the stand-in).
ABSENT = ("find", "xargs", "which", "tar", "gzip", "ps", "perl", "less", "file", "unzip", "xz")

# The runtime stage's environment as the DLC's Dockerfile sets it.
LIB_DIR = "opt/llama.cpp/bin"
ENV = {
    "PATH": f"/{LIB_DIR}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LD_LIBRARY_PATH": f"/{LIB_DIR}",
    "DEBIAN_FRONTEND": "noninteractive",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "DLC_CONTAINER_TYPE": "general",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "PYTHONIOENCODING": "UTF-8",
    "HF_HUB_ENABLE_HF_TRANSFER": "1",
}
ENTRYPOINT = "/usr/bin/serve"


def allowed(name: str) -> bool:
    """A command the base has: listed, or a versioned Python/pip (``python3.12``, ``pip3.12``)."""
    if name in COMMANDS:
        return True
    head, _, version = name.partition("3.")
    return head in {"python", "pip"} and version.isdigit()
