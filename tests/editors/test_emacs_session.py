"""Emacs 28 `emacs -nw` in a pty + eglot + draftline.el against the real server (fake engine).

Keys go through the terminal, so the command loop, post-command-hook and idle timers run as they do
for a user; emacsclient (a server socket the session opens) reads the state. Every wait polls a
condition up to a generous deadline; none asserts on a fixed sleep.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import threading
import time
from pathlib import Path

import pytest

from tests.editors.conftest import PY, REPO, server_env, which

SESSION_EL = REPO / "tests/editors/emacs_session.el"
DEADLINE = 40.0


def _controlling_tty() -> None:
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class EmacsSession:
    """One `emacs -nw -q` on a pty, visiting FILE with eglot + draftline started."""

    def __init__(self, tmp: Path, *, text: str, content: str, name: str = "demo.py", setup: str | None = None):
        self.file = tmp / name
        self.file.write_text(content)
        self.sock = str(tmp / "dl-sock")
        env = server_env() | {"DRAFTLINE_PY": PY, "REPO": str(REPO), "FILE": str(self.file), "DL_SOCKET": self.sock,
                              "DL_TEXT": text, "TERM": "xterm-256color"}
        if setup:
            env["DL_SETUP"] = setup
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.proc = subprocess.Popen([which("emacs"), "-nw", "-q", "-l", str(SESSION_EL)], stdin=slave, stdout=slave,
                                     stderr=slave, env=env, cwd=tmp, preexec_fn=_controlling_tty)
        os.close(slave)
        self._open = True
        threading.Thread(target=self._drain, daemon=True).start()  # a full pty would block Emacs' redisplay

    def _drain(self) -> None:
        while self._open:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    if not os.read(self.master, 65536):
                        return
                except OSError:
                    return

    def eval(self, form: str) -> str:
        done = subprocess.run(["emacsclient", "-s", self.sock, "--eval", form], capture_output=True, text=True,
                              timeout=30)
        if done.returncode:
            raise RuntimeError(done.stderr)
        return done.stdout.strip()

    def buf(self, form: str) -> str:
        """FORM evaluated in the visited file's buffer."""
        return self.eval(f'(with-current-buffer (find-buffer-visiting "{self.file}") {form})')

    def wait(self, form: str, deadline: float = DEADLINE) -> str:
        """Poll FORM (in the file's buffer) until it is non-nil; its printed value."""
        end, last = time.monotonic() + deadline, None
        while time.monotonic() < end:
            try:
                last = self.buf(form)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:  # the socket is not up yet
                last = str(exc)
            else:
                if last != "nil":
                    return last
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {form}: {last}\n{self.messages()}")

    def keys(self, text: str) -> None:
        os.write(self.master, text.encode())

    def ghost(self) -> str:
        return "(and draftline--overlay (substring-no-properties (overlay-get draftline--overlay 'after-string)))"

    def messages(self) -> str:
        try:
            return self.eval('(with-current-buffer "*Messages*" (buffer-string))')
        except Exception as exc:  # noqa: BLE001 - diagnostics only
            return f"(no *Messages*: {exc})"

    def status(self, key: str) -> str:
        return self.buf(f"(plist-get (jsonrpc-request (eglot-current-server) :draftline/status nil) :{key})")

    def ready(self) -> None:
        self.wait("(and draftline-inline-mode (eglot-current-server) (jsonrpc-running-p (eglot-current-server)))")

    def close(self) -> None:
        try:
            self.eval("(kill-emacs 0)")
            self.proc.wait(15)
        except Exception:  # noqa: BLE001 - it is going away either way
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(15)
        self._open = False
        os.close(self.master)


@pytest.fixture
def emacs_session(tmp_path):
    if not which("emacs") or not which("emacsclient"):
        pytest.skip("Emacs absent: apt-get install -y emacs-nox elpa-eglot")
    sessions: list[EmacsSession] = []

    def start(*, text: str = "eturn a + b", content: str = "def add(a, b):\n    \n", **kw) -> EmacsSession:
        session = EmacsSession(tmp_path, text=text, content=content, **kw)
        sessions.append(session)
        session.ready()
        return session

    yield start
    for session in sessions:
        session.close()


def goto_line_end(s: EmacsSession, line: int) -> None:
    s.buf(f"(progn (goto-char (point-min)) (forward-line {line - 1}) (end-of-line))")


def test_type_through_keeps_ghost_text(emacs_session):
    """Typing the ghost text's next characters keeps the rest shown (no flicker, no new request); TAB
    accepts it all, one undo takes exactly the accepted text back, didShow counts it once."""
    s = emacs_session()
    goto_line_end(s, 2)
    s.keys("r")
    assert s.wait(s.ghost()) == '"eturn a + b"'
    s.buf("(setq draftline-inline-idle 600)")  # from here on only the type-through can show anything
    s.keys("et")
    after = s.wait(f'(and (looking-back "ret" (line-beginning-position)) (list {s.ghost()}))')
    assert after == '("urn a + b")', s.messages()
    s.keys("\t")
    s.wait('(looking-back "return a \\\\+ b" (line-beginning-position))')
    assert s.buf("(buffer-substring-no-properties (point-min) (point-max))") == '"def add(a, b):\\n    return a + b\\n"'
    assert s.status("shown") == "1" and s.status("accepted") == "1"
    s.keys("\x1f")  # C-_ : undo
    s.wait('(string= (buffer-substring-no-properties (point-min) (point-max)) "def add(a, b):\\n    ret\\n")')


def test_an_edit_through_the_minibuffer_keeps_ghost_text_working(emacs_session):
    """M-x transpose-chars while ghost text is shown: the minibuffer's window change clears the ghost,
    then the command edits. That raised in post-command-hook (an overlay of nil), and Emacs took the hook
    off: the buffer never asked for ghost text again."""
    s = emacs_session()
    goto_line_end(s, 2)
    s.keys("r")
    assert s.wait(s.ghost()) == '"eturn a + b"'
    s.keys("\x1bx")  # M-x
    s.wait("(minibufferp (window-buffer (selected-window)))")
    s.keys("transpose-chars\r")
    s.wait('(looking-back "r " (line-beginning-position))')
    assert s.buf("(and (memq 'draftline--post-command post-command-hook) t)") == "t", s.messages()[-600:]
    assert "Error in post-command-hook" not in s.messages()
    s.keys("x")  # typing asks again
    assert s.wait(s.ghost()) == '"eturn a + b"'


def test_tab_indents_when_the_ghost_text_went_stale(emacs_session):
    """A change made outside a command (a process filter, auto-revert, another client) leaves the shown
    item stale: TAB must not insert it (at a range that now points elsewhere) but indent as usual."""
    s = emacs_session(content="def add(a, b):\n    \n")
    goto_line_end(s, 2)
    s.keys("r")
    s.wait(s.ghost())
    s.buf('(save-excursion (goto-char (point-min)) (insert "import os\\n"))')  # not a command: no post-command-hook
    assert s.buf("(key-binding (kbd \"TAB\"))") == "indent-for-tab-command"
    s.keys("\t")
    s.wait("(not draftline--overlay)")
    assert "eturn" not in s.buf("(buffer-substring-no-properties (point-min) (point-max))")


def test_python_backspace_asks_again(emacs_session):
    """python-mode's DEL (python-indent-dedent-line-backspace), like any edit, asks for ghost text."""
    s = emacs_session()
    goto_line_end(s, 2)
    s.keys("rx")
    s.wait('(looking-back "rx" (line-beginning-position))')
    s.wait(s.ghost())
    s.keys("\x7f")  # DEL
    assert s.wait(f'(and (looking-back "    r" (line-beginning-position)) {s.ghost()})') == '"eturn a + b"'


def test_accept_does_not_wait_for_the_server(emacs_session):
    """TAB inserts at once and Emacs keeps taking keys while the server does not answer the accept
    command (a hung or busy server): the command goes asynchronously."""
    s = emacs_session(setup="(setq jsonrpc-default-request-timeout 120)")
    goto_line_end(s, 2)
    s.keys("r")
    s.wait(s.ghost())
    # the server's answers no longer reach Emacs (the connection stays up)
    s.buf("(set-process-filter (jsonrpc--process (eglot-current-server)) #'ignore)")
    s.keys("\t")
    s.keys("x")
    s.wait('(looking-back "return a \\\\+ bx" (line-beginning-position))', deadline=60)


def test_mode_off_leaves_no_timer(emacs_session):
    """Turning draftline-inline-mode off cancels the pending idle request (which would otherwise show
    ghost text that no command ever clears)."""
    s = emacs_session(setup="(setq draftline-inline-idle 600)")
    goto_line_end(s, 2)
    s.keys("r")
    s.wait("(timerp draftline--timer)")
    s.buf("(draftline-inline-mode -1)")
    pending = s.eval("(cl-count-if (lambda (tm) (eq (timer--function tm) 'draftline--timer-fired)) timer-idle-list)")
    assert pending == "0"


def test_ghost_text_only_in_the_selected_window(emacs_session):
    """With the buffer in two windows the ghost text shows in the one being typed in only."""
    s = emacs_session()
    s.buf("(split-window)")
    goto_line_end(s, 2)
    s.keys("r")
    s.wait(s.ghost())
    assert s.buf("(eq (overlay-get draftline--overlay 'window) (selected-window))") == "t"


def test_leaving_the_window_removes_the_ghost_text(emacs_session):
    """C-x o to another window (whose buffer has no draftline hook) takes the ghost text away too."""
    s = emacs_session()
    s.buf('(set-window-buffer (split-window) (get-buffer-create "*scratch*"))')
    goto_line_end(s, 2)
    s.keys("r")
    s.wait(s.ghost())
    s.keys("\x18o")  # C-x o
    s.wait('(equal (buffer-name (window-buffer)) "*scratch*")')
    s.wait("(not draftline--overlay)")


def test_reconnect_after_server_crash(emacs_session):
    """When the server dies and eglot reconnects, the buffer is managed by the new server (not left
    with the dead one cached) and ghost text comes back."""
    s = emacs_session()
    pid = int(s.buf("(process-id (jsonrpc--process (eglot-current-server)))"))
    # eglot reconnects only a server that lived > 3 s (eglot--inhibit-autoreconnect's timer)
    s.wait("(not (timerp (eglot--inhibit-autoreconnect (eglot-current-server))))")
    os.kill(pid, signal.SIGKILL)
    s.wait(f"(and eglot--managed-mode draftline-inline-mode (jsonrpc-running-p (eglot-current-server)) "
           f"(/= {pid} (process-id (jsonrpc--process (eglot-current-server)))))")
    goto_line_end(s, 2)
    s.keys("r")
    assert s.wait(s.ghost()) == '"eturn a + b"'


def test_byte_compiled_without_eglot_loaded(tmp_path):
    """draftline.elc compiled where eglot is not loaded (package.el, make) must not break eglot's
    loading: its `defclass' has to compile as a macro."""
    emacs = which("emacs")
    if not emacs:
        pytest.skip("Emacs absent: apt-get install -y emacs-nox elpa-eglot")
    src = tmp_path / "draftline.el"
    src.write_text((REPO / "editors/emacs/draftline.el").read_text())
    comp = subprocess.run([emacs, "--batch", "-q", "-f", "batch-byte-compile", str(src)], capture_output=True,
                          text=True, timeout=120)
    assert comp.returncode == 0, comp.stderr
    assert "Warning" not in comp.stderr, comp.stderr
    load = subprocess.run([emacs, "--batch", "-q", "-l", str(tmp_path / "draftline.elc"), "--eval",
                           "(progn (require 'eglot) (princ (format \"class=%s\" "
                           "(eieio-class-name (find-class 'draftline-eglot-server)))))"],
                          capture_output=True, text=True, timeout=120)
    assert "class=draftline-eglot-server" in load.stdout, load.stderr[-2000:]
