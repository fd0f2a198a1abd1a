"""`rlai chat` driven the way a person uses it: in a terminal (tmux
send-keys / capture-pane). History recall with Up, Ctrl-C mid-reply keeps
the conversation, /reset asks first, an empty line does not quit, Ctrl-C
at an empty prompt quits, Enter then Ctrl-C leaves no full reply. The
model runs in-process (--local), and over a running `rlai serve`, where
Ctrl-C sends a cancel."""
import ctypes
import json
import os
import platform
import signal
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

RLAI = os.environ.get("RLAI_BIN")
MODELS = Path(os.environ.get("RLAI_MODELS_DIR", "models"))
MODEL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"

pytestmark = [pytest.mark.skipif(not RLAI, reason="RLAI_BIN not set (run through meson test)"),
              pytest.mark.skipif(not MODEL.exists(), reason="default model not fetched"),
              pytest.mark.skipif(not shutil.which("tmux"), reason="tmux not installed (scripts/setup.sh)")]


class Term:
    """One tmux server of its own (-L) running one command in a pane."""

    def __init__(self, tmp, cmd, env):
        self.sock = f"rlai-test-{os.getpid()}-{id(self)}"
        self.tmp = tmp
        envs = [f"{k}={v}" for k, v in env.items()]
        # the pane's command ends with a marker so the test sees rlai exit
        shell = " ".join(["env", *envs, *cmd]) + "; echo RLAI-EXIT=$?; sleep 600"
        subprocess.run(["tmux", "-L", self.sock, "-f", "/dev/null", "new-session", "-d", "-s", "t",
                        "-x", "200", "-y", "50", shell], check=True)

    def keys(self, *k):
        subprocess.run(["tmux", "-L", self.sock, "send-keys", "-t", "t", *k], check=True)

    def type_line(self, text):
        self.keys("-l", text)
        self.keys("Enter")

    def screen(self):
        return subprocess.run(["tmux", "-L", self.sock, "capture-pane", "-p", "-J", "-S", "-200", "-t", "t"],
                              capture_output=True, check=True).stdout.decode()

    def wait_for(self, pred, timeout=120, what=""):
        deadline = time.time() + timeout
        while time.time() < deadline:
            s = self.screen()
            if pred(s):
                return s
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}:\n{self.screen()}")

    def close(self):
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True)


def at_prompt(t, what="the prompt"):
    """Waits for an empty prompt at the bottom of the screen. A Ctrl-C meant
    for that prompt must wait for it: the reader forgets a Ctrl-C taken
    before it draws the prompt (one that stopped a reply, say), and on a
    loaded machine the test can beat it there after a command's output."""
    return t.wait_for(lambda s: s.strip() and s.rstrip().splitlines()[-1].rstrip() == ">", what=what)


def prompts(screen):
    """Lines that are an empty prompt (the cursor waits there)."""
    return [line for line in screen.splitlines() if line.rstrip() == ">"]


@pytest.fixture
def chat(tmp_path):
    state = tmp_path / "state"
    env = {"XDG_STATE_HOME": str(state), "XDG_RUNTIME_DIR": str(tmp_path), "TERM": "xterm"}
    t = Term(tmp_path, [RLAI, "chat", "--local", "-m", str(MODEL), "--temp", "0", "-n", "400", "-t", "2"], env)
    t.state = state
    t.wait_for(lambda s: "rlai chat:" in s and s.rstrip().endswith(">"), what="the first prompt")
    yield t
    t.close()


def pane_rlai_pid(t):
    """The pid of the rlai process in the pane (the pane's shell's child)."""
    out = subprocess.run(["tmux", "-L", t.sock, "list-panes", "-t", "t", "-F", "#{pane_pid}"],
                         capture_output=True, check=True, text=True).stdout
    sh = int(out.split()[0])
    kids = Path(f"/proc/{sh}/task/{sh}/children").read_text().split()
    assert kids, "no process in the pane"
    return int(kids[0])


TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine())


def sigint_to_thread(pid, tid):
    """SIGINT to one thread (tgkill): what the kernel does when it picks a
    thread other than the main one for a terminal's Ctrl-C."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(TGKILL, pid, tid, signal.SIGINT) == 0, os.strerror(ctypes.get_errno())


def n_metrics(screen):
    return screen.count("[prompt ")


def ctrl_c_mid_reply(t):
    """Asks for a long reply, presses Ctrl-C once it has started, and
    returns the screen with the stop note."""
    t.type_line("Write a very long story about a dragon and a knight.")
    # (the typed line must be on screen first: without it the split is the
    # whole screen, and Ctrl-C would go out before the reply began)
    t.wait_for(lambda s: "dragon and a knight." in s and len(s.split("dragon and a knight.")[-1].strip()) > 40,
               what="the reply to start")
    t.keys("C-c")
    return t.wait_for(lambda s: "reply stopped" in s, what="the stop note")


def enter_then_ctrl_c(t, saved, before):
    """Enter then Ctrl-C at once: wherever the Ctrl-C lands (before the
    reader took the Enter, which it flushes unread; between Enter and the
    first token; mid-reply) there is no full reply: the line is dropped, or
    the reply is stopped and kept. `before`: the roles of the conversation
    so far."""
    stops = t.screen().count("reply stopped")
    line = "Tell me a very long story about a castle."
    echoed = t.screen().count(line)
    t.keys("-l", line)
    # Enter and Ctrl-C go out once the reader has the line (its echo): a
    # Ctrl-C that lands before the reader read a single key flushes the
    # tty's unread input, and Ctrl-C at what is then an empty prompt quits,
    # as it should. No typist beats a reader idle in poll() to its first
    # key; tmux on a loaded CI machine did once.
    t.wait_for(lambda s: s.count(line) > echoed, what="the line's echo")
    t.keys("Enter")
    t.keys("C-c")
    # typed at once: a Ctrl-C taken between two reads of the line reader
    # (echoing a key) once made this line the one dropped; see
    # test_chat_ctrl_c_on_another_thread
    t.type_line(f"/save {saved}")   # read once the prompt is back
    s = t.wait_for(lambda s: f"to {saved})" in s, what="/save after Enter and Ctrl-C")
    msgs = json.loads(saved.read_text())["messages"]
    assert [m["role"] for m in msgs] in (before, before + ["user", "assistant"]), msgs
    if len(msgs) > len(before):
        assert s.count("reply stopped") == stops + 1, s
        assert msgs[-2]["content"] == line
    return s


def test_chat_in_a_terminal(chat, tmp_path):
    t = chat
    # an empty line does not quit
    t.keys("Enter")
    time.sleep(0.5)
    assert "RLAI-EXIT" not in t.screen()
    t.type_line("My name is Ada. Say hello.")
    t.wait_for(lambda s: n_metrics(s) == 1, what="the first reply")
    # Ctrl-C mid-reply: stops that reply, keeps the conversation
    s = ctrl_c_mid_reply(t)
    assert "RLAI-EXIT" not in s and "stop" in s
    # history: Up recalls the last line; Ctrl-C on a non-empty line only drops it
    t.wait_for(lambda s: s.rstrip().endswith(">"), what="a prompt")
    t.keys("Up")
    t.wait_for(lambda s: s.rstrip().endswith("> Write a very long story about a dragon and a knight."),
               what="history recall")
    t.keys("C-c")
    time.sleep(0.5)
    assert "RLAI-EXIT" not in t.screen()
    # the conversation was kept: both turns, the stopped reply partial
    saved = tmp_path / "conv.json"
    t.type_line(f"/save {saved}")
    t.wait_for(lambda s: "saved 4 messages" in s, what="/save")
    msgs = json.loads(saved.read_text())["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert msgs[0]["content"] == "My name is Ada. Say hello." and msgs[3]["content"]
    # /reset asks first: "n" keeps, "y" resets
    t.type_line("/reset")
    t.wait_for(lambda s: s.rstrip().endswith("[y/N]"), what="the confirmation")
    t.type_line("n")
    t.wait_for(lambda s: "(kept)" in s, what="kept")
    t.type_line("/system You are terse.")
    t.wait_for(lambda s: "system prompt set" in s, what="/system")
    t.type_line("/reset")
    t.wait_for(lambda s: s.count("[y/N]") == 2, what="the second confirmation")
    t.type_line("y")
    t.wait_for(lambda s: "conversation reset" in s, what="reset")
    t.type_line(f"/save {saved}")
    t.wait_for(lambda s: "saved 1 messages" in s, what="/save after reset")
    assert json.loads(saved.read_text())["messages"] == [{"role": "system", "content": "You are terse."}]
    enter_then_ctrl_c(t, tmp_path / "conv2.json", ["system"])
    # Ctrl-C at an empty prompt quits, status 0
    at_prompt(t)
    t.keys("C-c")
    s = t.wait_for(lambda s: "RLAI-EXIT=" in s, what="exit")
    assert "RLAI-EXIT=0" in s
    # the history file: under XDG_STATE_HOME, 0600, the lines typed
    hist = t.state / "rlai" / "chat_history"
    assert stat.S_IMODE(hist.stat().st_mode) == 0o600
    text = hist.read_text()
    assert "Ada" in text and "/reset" in text


@pytest.mark.skipif(TGKILL is None, reason="tgkill number unknown for this machine")
def test_chat_ctrl_c_on_another_thread(chat, tmp_path):
    """A Ctrl-C acts at once even when its handler does not interrupt the
    line reader's read(): here it runs on a worker thread of the in-process
    engine (the kernel may pick any thread that does not block SIGINT; a
    SIGINT taken while the reader echoes a key is the same case). Before,
    the flag waited for the next Enter and dropped the line just typed."""
    t = chat
    pid = pane_rlai_pid(t)
    workers = [int(x) for x in os.listdir(f"/proc/{pid}/task") if int(x) != pid]
    if not workers:
        pytest.skip("the in-process engine has no worker thread here")
    # Ctrl-C on a line being typed drops it at once: a new prompt, no Enter
    dropped = tmp_path / "dropped.json"
    t.keys("-l", f"/save {dropped}")
    t.wait_for(lambda s: s.rstrip().endswith(f"> /save {dropped}"), what="the typed line")
    sigint_to_thread(pid, workers[0])
    t.wait_for(lambda s: prompts(s) and s.rstrip().endswith(">") and f"/save {dropped}" in s,
               timeout=10, what="the line dropped and a new prompt")
    kept = tmp_path / "kept.json"
    t.type_line(f"/save {kept}")
    t.wait_for(lambda s: f"to {kept})" in s, what="/save on the next line")
    assert not dropped.exists() and kept.exists()
    # Ctrl-C at an empty prompt quits at once
    at_prompt(t)
    sigint_to_thread(pid, workers[0])
    s = t.wait_for(lambda s: "RLAI-EXIT=" in s, timeout=10, what="exit on Ctrl-C at an empty prompt")
    assert "RLAI-EXIT=0" in s


def test_chat_reads_non_ascii_in_the_c_locale(tmp_path):
    """Typed UTF-8 reaches the model whole, also with LC_ALL=C (a bare ssh
    session or container): libedit used to drop every byte above 127 there,
    so "Héllo" became "Hllo"."""
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "XDG_RUNTIME_DIR": str(tmp_path), "TERM": "xterm",
           "LC_ALL": "C"}
    t = Term(tmp_path, [RLAI, "chat", "--local", "-m", str(MODEL), "--temp", "0", "-n", "4", "-t", "2"], env)
    try:
        t.wait_for(lambda s: "rlai chat:" in s and s.rstrip().endswith(">"), what="the first prompt")
        text = "Héllo wörld, ça va? Привет 你好 🐉"
        t.type_line(text)
        t.wait_for(lambda s: n_metrics(s) == 1, what="the reply")
        # editing works on characters: Backspace removes the whole 🐉
        t.keys("-l", "x🐉")
        t.keys("BSpace")
        t.keys("Enter")
        t.wait_for(lambda s: n_metrics(s) == 2, what="the second reply")
        saved = tmp_path / "c.json"
        t.type_line(f"/save {saved}")
        t.wait_for(lambda s: f"to {saved})" in s, what="/save")
        msgs = json.loads(saved.read_text(encoding="utf-8"))["messages"]
        assert [m["content"] for m in msgs if m["role"] == "user"] == [text, "x"], msgs
    finally:
        t.close()


@pytest.fixture
def engine_rt(tmp_path):
    """A running `rlai serve` (no plugins, no HTTP) whose sockets are under
    the returned XDG_RUNTIME_DIR, where `rlai chat` looks by default."""
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(rt), XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        p = subprocess.Popen([RLAI, "serve", "-m", str(MODEL), "-t", "2", "-c", "2048", "--no-plugins", "--http", ""],
                             env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.time() + 120
        while b"ready" not in log_path.read_bytes():
            assert p.poll() is None and time.time() < deadline, log_path.read_text()
            time.sleep(0.1)
        yield rt
    finally:
        # also when the engine never got ready: no `rlai serve` outlives the test
        p.terminate()
        rc = p.wait(timeout=60)
    assert rc == 0, log_path.read_text()


def test_chat_over_the_engine_ctrl_c_cancels(engine_rt, tmp_path):
    """Over the engine (no --local), Ctrl-C mid-reply sends a cancel: the
    reply ends with `stop cancelled`, the conversation keeps the partial
    reply, and Enter-then-Ctrl-C leaves no full reply either."""
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "XDG_RUNTIME_DIR": str(engine_rt), "TERM": "xterm"}
    t = Term(tmp_path, [RLAI, "chat", "--temp", "0", "-n", "1500"], env)
    try:
        t.wait_for(lambda s: "rlai chat:" in s and s.rstrip().endswith(">"), what="the first prompt")
        s = ctrl_c_mid_reply(t)
        assert "stop cancelled" in s or "[stopped: " in s, s
        assert "RLAI-EXIT" not in s and "1500 tok" not in s
        saved = tmp_path / "conv.json"
        t.type_line(f"/save {saved}")
        t.wait_for(lambda s: f"to {saved})" in s, what="/save")
        msgs = json.loads(saved.read_text())["messages"]
        assert [m["role"] for m in msgs] == ["user", "assistant"] and msgs[1]["content"], msgs
        enter_then_ctrl_c(t, tmp_path / "conv2.json", ["user", "assistant"])
        at_prompt(t)
        t.keys("C-c")
        s = t.wait_for(lambda s: "RLAI-EXIT=" in s, what="exit")
        assert "RLAI-EXIT=0" in s
    finally:
        t.close()


def test_chat_without_a_terminal_reads_lines(tmp_path):
    """Piped stdin: plain line input, same commands, EOF ends it."""
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), XDG_RUNTIME_DIR=str(tmp_path))
    saved = tmp_path / "c.json"
    inp = f"\nHi\n/help\n/save {saved}\n".encode()
    r = subprocess.run([RLAI, "chat", "--local", "-m", str(MODEL), "--temp", "0", "-n", "8"], input=inp,
                       capture_output=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert b"/reset" in r.stderr and b"/save FILE" in r.stderr     # /help
    assert [m["role"] for m in json.loads(saved.read_text())["messages"]] == ["user", "assistant"]
