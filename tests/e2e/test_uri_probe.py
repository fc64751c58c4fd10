"""Document URIs and file paths as real editors send them, through the real server over stdio.

Editors spell the same file differently: VS Code percent-encodes everything but unreserved characters
and '/', upper-case hex (``%C3%A9``, ``%2B``, ``%3A``); Neovim's ``vim.uri_from_fname`` leaves RFC 3986's
sub-delimiters (``+ & = , ; ! $ ' ( ) * : @``) as they are and writes lower-case hex (``%c3%a9``); a
client that takes the workspace from its working directory gets the symlink-resolved path (getcwd)
while the file it opens keeps the name it was opened by, and Emacs' eglot sends ``file-truename``s;
RFC 8089 allows ``file://localhost/...`` and ``file:/...``. Whatever the spelling, a file is one
document for the index overlay (the unsaved buffer is what retrieval serves), for own-file exclusion
and for the index's path keys, and the model sees its workspace-relative name.

The answers come from an OpenAI-compatible SSE server on 127.0.0.1 (engine.sse_server), so the
prompt the model got (its ``<|file_sep|>path`` headers, its snippets) is read back from the request.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

import pytest
from lsprotocol import types as t
from pytest_lsp import LanguageClient

from engine.sse_server import SSEServer
from tests.e2e.lsp_harness import capabilities, end_of, inline_params, items, open_doc, status, wait_for

HELPERS = "def compute_checksum(data):\n    total = 0\n    for byte in data:\n        total += byte\n    return total\n"
MAIN_ON_DISK = "def checksum_of(payload):\n    disk_only_marker = 1\n"
TYPED = "def checksum_of(payload):\n    return compute_checksum"
FILE_SEP = "<|file_sep|>"


@pytest.fixture
def backend():
    with SSEServer(chunks=["(payload)"]) as srv:
        yield srv


def settings(srv: SSEServer, tmp_path: Path) -> dict:
    remote = {"url": srv.url, "model": "Qwen/Qwen2.5-Coder-7B", "timeout_ms": 5000}
    return {"draftline": {
        "model": {"remote": remote},
        "completion": {"debounce_ms": 0},
        "index": {"overlay_delay_ms": 0,
                  "options": {"embedder": "none", "cache_dir": str(tmp_path / "cache"), "bm25_df_cutoff": 0}},
    }}


async def start(client: LanguageClient, init_options: dict, *, folders: list[str] | None = None,
                root_uri: str | None = None, root_path: str | None = None) -> dict:
    """initialize with the workspace as given (folders' URIs, rootUri, rootPath), then the engine ready."""
    client.registrations = []  # type: ignore[attr-defined]

    @client.feature(t.CLIENT_REGISTER_CAPABILITY)
    def register_capability(params: t.RegistrationParams) -> None:
        client.registrations.extend(params.registrations)  # type: ignore[attr-defined]

    params = t.InitializeParams(
        capabilities=capabilities("visual-studio-code"),
        initialization_options=init_options,
        workspace_folders=[t.WorkspaceFolder(uri=u, name=u.rstrip("/").rsplit("/", 1)[-1]) for u in folders]
        if folders is not None else None,
        root_uri=root_uri,
        root_path=root_path,
    )
    await client.initialize_session(params)
    return await wait_for(client, lambda s: s["engine"]["state"] == "ready")


def vscode_uri(path: Path | str) -> str:
    """As VS Code's URI.file(...).toString(): every byte but unreserved characters and '/' encoded, upper-case hex."""
    return "file://" + quote(str(path), safe="/")


def neovim_uri(path: Path | str) -> str:
    """As Neovim's vim.uri_from_fname: RFC 3986's reserved characters left as they are, lower-case hex."""
    keep = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/")
    out = "".join(chr(b) if chr(b) in keep else f"%{b:02x}" for b in os.fsencode(str(path)))
    return "file://" + out


def prompt_of(srv: SSEServer) -> str:
    return str(srv.requests[-1]["body"]["prompt"])


def headers(prompt: str) -> list[str]:
    """The file names the model was shown: each ``<|file_sep|>`` header line."""
    return [part.split("\n", 1)[0] for part in prompt.split(FILE_SEP)[1:]]


async def complete(client: LanguageClient, srv: SSEServer, uri: str, text: str) -> str:
    before = len(srv.requests)
    found = items(await client.text_document_inline_completion_async(inline_params(end_of(text), uri)))
    assert found, "no completion"
    assert len(srv.requests) == before + 1
    return prompt_of(srv)


def workspace(base: Path, name: str = "ws") -> Path:
    root = base / name
    root.mkdir(parents=True)
    (root / "helpers.py").write_text(HELPERS)
    (root / "main.py").write_text(MAIN_ON_DISK)
    return root


# -- symlinked workspace roots -------------------------------------------------------------------------


async def symlinked(client: LanguageClient, backend: SSEServer, tmp_path: Path, root_by: str) -> tuple[Path, Path]:
    """A workspace reachable as ``real place/ws`` and as the symlink ``link``: (the root given, the other name)."""
    real = workspace(tmp_path / "real place")
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    root, other = (link, real) if root_by == "link" else (real, link)
    await start(client, settings(backend, tmp_path), folders=[root.as_uri()])
    ready = await wait_for(client, lambda s: s["index"]["state"] == "ready")
    assert ready["index"]["files"] == 2
    return root, other


BOTH_WAYS = pytest.mark.parametrize("root_by", ["link", "real"])


@BOTH_WAYS
async def test_a_file_opened_by_the_other_name_of_a_symlinked_root(client: LanguageClient, backend: SSEServer,
                                                                    tmp_path: Path, root_by: str):
    """The workspace folder by one name, the file opened by the other (a client whose root is its
    getcwd(), resolved, opening ``~/link/main.py``; or the reverse): the model is shown ``main.py``, not
    the absolute path, with the root's repository header; the file's own stale disk copy is not
    retrieved; its unsaved text is what the index serves to other files, also after a change on disk
    reported under the root's name."""
    root, other = await symlinked(client, backend, tmp_path, root_by)
    uri = (other / "main.py").as_uri()
    open_doc(client, TYPED, uri=uri)
    await wait_for(client, lambda s: s["index"]["pending"] == 0)
    prompt = await complete(client, backend, uri, TYPED)
    assert headers(prompt)[-1] == "main.py", headers(prompt)  # not /tmp/.../link/main.py
    assert str(tmp_path) not in prompt and "<|repo_name|>" in prompt  # the root's repository holds it
    assert "disk_only_marker" not in prompt  # the file's own (stale) disk version is no snippet
    assert (await status(client))["index"]["files"] == 2  # one file, not a second key for it

    fresh = "def checksum_of(payload):\n    return 1\n\n\ndef freshly_typed_only_in_buffer(x):\n    return x\n"
    change = t.TextDocumentContentChangeWholeDocument(text=fresh)
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=2), content_changes=[change]))
    use = "from main import freshly_typed_only_in_buffer\n\nvalue = freshly_typed_only_in_buffer"
    use_uri = (root / "use.py").as_uri()
    open_doc(client, use, uri=use_uri)
    await wait_for(client, lambda s: s["index"]["pending"] == 0)
    prompt = await complete(client, backend, use_uri, use)
    assert "def freshly_typed_only_in_buffer" in prompt.split("<|fim_prefix|>")[0], headers(prompt)

    # a save elsewhere: helpers.py unsaved by the other name, changed on disk (another tool) and reported
    # under the root's name: the index keeps serving the buffer, not the disk
    helpers_uri = (other / "helpers.py").as_uri()
    open_doc(client, HELPERS.replace("compute_checksum", "buffer_checksum"), uri=helpers_uri)
    await wait_for(client, lambda s: s["index"]["pending"] == 0)
    (root / "helpers.py").write_text(HELPERS.replace("compute_checksum", "disk_checksum"))
    event = t.FileEvent(uri=(root / "helpers.py").as_uri(), type=t.FileChangeType.Changed)
    client.workspace_did_change_watched_files(t.DidChangeWatchedFilesParams(changes=[event]))
    await wait_for(client, lambda s: s["index"]["pending"] == 0)
    typed = "value = buffer_checksum"
    typed_uri = (root / "other.py").as_uri()
    open_doc(client, typed, uri=typed_uri)
    prompt = await complete(client, backend, typed_uri, typed)
    assert "def buffer_checksum" in prompt and "disk_checksum" not in prompt, headers(prompt)


@BOTH_WAYS
async def test_the_watcher_follows_a_symlinked_root(client: LanguageClient, backend: SSEServer, tmp_path: Path,
                                                    root_by: str):
    """No client file events: a file made on disk (by either name) reaches the index under the root's name."""
    root, other = await symlinked(client, backend, tmp_path, root_by)
    assert (await status(client))["index"]["watching"]
    (other / "made_on_disk.py").write_text("def made_on_disk_helper():\n    return 7\n")
    await wait_for(client, lambda s: s["index"]["files"] == 3 and s["index"]["pending"] == 0, deadline_s=20)
    use = "value = made_on_disk_helper"
    use_uri = (root / "main.py").as_uri()
    open_doc(client, use, uri=use_uri)
    prompt = await complete(client, backend, use_uri, use)
    assert "made_on_disk.py" in headers(prompt), headers(prompt)


# -- spellings of one file URI ----------------------------------------------------------------------------

ODD = "dir é 日本 #1 %20 ?q+a&b=c 😀"  # a folder name with every character editors encode differently


def localhost_uri(path: Path) -> str:
    return "file://localhost" + quote(str(path), safe="/")


def one_slash_uri(path: Path) -> str:
    return "file:" + quote(str(path), safe="/")


SPELLINGS = {"vscode": vscode_uri, "neovim": neovim_uri, "localhost": localhost_uri, "one-slash": one_slash_uri}
@pytest.mark.parametrize("folder_by, file_by, event_by", [  # each spelling as folder, file and event at least once
    ("vscode", "neovim", "localhost"), ("one-slash", "localhost", "vscode"), ("neovim", "one-slash", "neovim"),
    ("localhost", "vscode", "one-slash"),
])
async def test_one_file_however_its_uri_is_spelled(client: LanguageClient, backend: SSEServer, tmp_path: Path,
                                                    folder_by: str, file_by: str, event_by: str):
    """The folder, the open file and the client's file event each spelled by another editor's rules:
    the model sees the relative name, the file's disk copy is not retrieved for itself, and a change on
    disk reported while the buffer is unsaved leaves the buffer's text in the index."""
    root = workspace(tmp_path, ODD)
    (root / "sub ü").mkdir()
    target = root / "sub ü" / "a+b&c #%.py"
    target.write_text("def checksum_of(payload):\n    own_disk_marker = 1\n")
    await start(client, settings(backend, tmp_path), folders=[SPELLINGS[folder_by](root)])
    ready = await wait_for(client, lambda s: s["index"]["state"] == "ready")
    assert ready["index"]["files"] == 3 and ready["roots"] == [str(root)]

    uri = SPELLINGS[file_by](target)
    open_doc(client, TYPED, uri=uri)
    await wait_for(client, lambda s: s["index"]["pending"] == 0)
    prompt = await complete(client, backend, uri, TYPED)
    assert headers(prompt)[-1] == "sub ü/a+b&c #%.py", headers(prompt)
    assert f"<|repo_name|>{ODD}\n" in prompt
    assert "own_disk_marker" not in prompt

    # saved elsewhere (another tool): the client's watcher reports it, the buffer stays what counts
    target.write_text("def checksum_of(payload):\n    own_disk_marker = 2\n")
    event = t.FileEvent(uri=SPELLINGS[event_by](target), type=t.FileChangeType.Changed)
    client.workspace_did_change_watched_files(t.DidChangeWatchedFilesParams(changes=[event]))
    other = "from helpers import compute_checksum\n\nx = checksum_of"
    other_uri = SPELLINGS[file_by](root / "use.py")
    open_doc(client, other, uri=other_uri)
    await wait_for(client, lambda s: s["index"]["pending"] == 0)
    prompt = await complete(client, backend, other_uri, other)
    assert headers(prompt)[-1] == "use.py"
    assert "own_disk_marker" not in prompt and "return compute_checksum" in prompt, prompt
    assert (await status(client))["index"]["files"] == 4  # use.py's buffer too, and no second key for either


async def test_a_localhost_uri_names_the_local_file(client: LanguageClient, backend: SSEServer, tmp_path: Path):
    """RFC 8089's ``file://localhost/...``: the model is shown the workspace-relative name (it was shown
    ``//localhost/<absolute path>``), in the folder's repository, and the file's own disk copy is not
    retrieved for it."""
    root = workspace(tmp_path, ODD)
    await start(client, settings(backend, tmp_path), folders=[vscode_uri(root)])
    await wait_for(client, lambda s: s["index"]["state"] == "ready")
    uri = localhost_uri(root / "main.py")
    open_doc(client, TYPED, uri=uri)
    await wait_for(client, lambda s: s["index"]["pending"] == 0)
    prompt = await complete(client, backend, uri, TYPED)
    assert headers(prompt)[-1] == "main.py" and f"<|repo_name|>{ODD}\n" in prompt, headers(prompt)
    assert "disk_only_marker" not in prompt and "localhost" not in prompt


# -- how the workspace is given --------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["folder-slash", "root-uri-slash", "root-path-slash", "empty-folders-root-uri",
                                 "root-uri-localhost"])
async def test_the_workspace_however_it_is_given(client: LanguageClient, backend: SSEServer, tmp_path: Path, how: str):
    root = workspace(tmp_path, "my proj é")
    given = {
        "folder-slash": {"folders": [vscode_uri(root) + "/"]},
        "root-uri-slash": {"root_uri": neovim_uri(root) + "/"},
        "root-uri-localhost": {"root_uri": localhost_uri(root)},
        "root-path-slash": {"root_path": str(root) + "/"},
        "empty-folders-root-uri": {"folders": [], "root_uri": vscode_uri(root)},
    }[how]
    await start(client, settings(backend, tmp_path), **given)
    ready = await wait_for(client, lambda s: s["index"]["state"] in ("ready", "failed", "unavailable"))
    assert ready["roots"] == [str(root)] and ready["index"] == {**ready["index"], "state": "ready", "files": 2}
    uri = vscode_uri(root / "main.py")
    open_doc(client, TYPED, uri=uri)
    prompt = await complete(client, backend, uri, TYPED)
    assert headers(prompt)[-1] == "main.py" and "<|repo_name|>my proj é\n" in prompt


# -- not a workspace file ------------------------------------------------------------------------------------

async def test_a_file_outside_every_folder_is_completed_and_kept_out_of_the_index(client: LanguageClient,
                                                                                    backend: SSEServer, tmp_path: Path):
    root = workspace(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    await start(client, settings(backend, tmp_path), folders=[root.as_uri()])
    await wait_for(client, lambda s: s["index"]["state"] == "ready")
    uri = (outside / "loose.py").as_uri()
    open_doc(client, TYPED, uri=uri)
    await complete(client, backend, uri, TYPED)
    assert "<|repo_name|>" not in prompt_of(backend)  # no folder holds it
    assert (await wait_for(client, lambda s: s["index"]["pending"] == 0))["index"]["files"] == 2


OTHER_URIS = [
    "untitled:Untitled-1",
    "vscode-notebook-cell:/home/someone/nb.ipynb#W0sZmlsZQ%3D%3D",  # a cell of no open notebook
    "git:/home/someone/ws/main.py?%7B%22path%22%3A%22%2Fhome%2Fsomeone%2Fws%2Fmain.py%22%2C%22ref%22%3A%22~%22%7D",
    "vscode-vfs://github/someone/ws/main.py",
    "fugitive:///home/someone/ws/.git//0/main.py",
    "file:///draftline-nowhere/main.py?query=1",
    "file:///draftline-nowhere/main.py#L3",
    "file:///draftline-nowhere/bad%ZZ%E9.py",
    "file://server/share/main.py",  # a UNC share
]


async def test_other_schemes_never_crash(client: LanguageClient, backend: SSEServer, tmp_path: Path):
    """Each URI opened, completed, saved, closed and reported deleted, one after another in one session."""
    root = workspace(tmp_path)
    await start(client, settings(backend, tmp_path), folders=[root.as_uri()])
    await wait_for(client, lambda s: s["index"]["state"] == "ready")
    for i, uri in enumerate(OTHER_URIS):
        typed = f"{TYPED}_{i}"  # another prompt each time (two of these name one path: a cached answer asks nothing)
        open_doc(client, typed, uri=uri)
        await complete(client, backend, uri, typed)
        client.text_document_did_save(t.DidSaveTextDocumentParams(text_document=t.TextDocumentIdentifier(uri=uri)))
        client.text_document_did_close(t.DidCloseTextDocumentParams(text_document=t.TextDocumentIdentifier(uri=uri)))
        event = t.FileEvent(uri=uri, type=t.FileChangeType.Deleted)
        client.workspace_did_change_watched_files(t.DidChangeWatchedFilesParams(changes=[event]))
        current = await wait_for(client, lambda s: s["index"]["pending"] == 0 and s["documents"] == 0)
        assert current["errors"] == 0 and current["index"]["files"] == 2, uri


# -- the helpers themselves (no server) ------------------------------------------------------------------

def test_every_spelling_of_a_file_uri_reads_as_one_path(tmp_path: Path):
    from lsp_server.documents import in_roots, relative_path, uri_to_path

    path = tmp_path / ODD / "sub ü" / "a+b&c #%.py"
    spellings = {f(path) for f in SPELLINGS.values()}  # upper and lower-case hex, +&: raw and encoded
    assert len(spellings) == 4
    assert {uri_to_path(u) for u in spellings} == {str(path)}
    assert uri_to_path("file:///x.py?query=1") == uri_to_path("file:///x.py#L3") == "/x.py"
    assert uri_to_path("file://[oops/x.py") is None  # pygls' to_fs_path raised ValueError
    assert uri_to_path("FILE:///x.py") == "/x.py"  # a scheme is case-insensitive
    assert uri_to_path("file://server/share/x.py") == "//server/share/x.py"  # UNC, as before
    for uri in ("untitled:Untitled-1", "git:/x.py?%7B%7D", "vscode-vfs://github/o/r/x.py", "file:"):
        assert uri_to_path(uri) is None
    assert relative_path("untitled:Untitled-1", [tmp_path]) == "untitled:Untitled-1"
    assert relative_path(localhost_uri(path), [tmp_path / ODD]) == "sub ü/a+b&c #%.py"
    assert relative_path(vscode_uri(tmp_path / ODD / ".." / "elsewhere.py"), [tmp_path / ODD]) != "../elsewhere.py"

    real = tmp_path / "real"
    (real / "pkg").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    assert in_roots(str(real / "pkg" / "m.py"), [link]) == str(link / "pkg" / "m.py")
    assert in_roots(str(link / "pkg" / "m.py"), [real]) == str(real / "pkg" / "m.py")
    assert in_roots(str(link), [real]) == str(real)
    assert in_roots(str(tmp_path / "elsewhere.py"), [real]) is None and in_roots("/x.py", []) is None
    assert relative_path((real / "pkg" / "m.py").as_uri(), [link]) == "pkg/m.py"
