"""Configuration values for the indexer (one frozen dataclass, no behaviour beyond defaults)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

# File names that are never indexed while ``IndexConfig.exclude_secrets`` is on.
# Matched against the file's base name with gitwildmatch semantics.
DEFAULT_SECRET_NAME_PATTERNS: tuple[str, ...] = (
    ".env",
    ".env.*",
    "*.env",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    "*.kdbx",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    "*.ppk",
    ".netrc",
    "_netrc",
    ".pgpass",
    ".npmrc",
    ".pypirc",
    ".git-credentials",
    ".htpasswd",
    "credentials",
    "credentials.*",
    "*credentials*.json",
    "secrets.json",
    "secrets.yml",
    "secrets.yaml",
    "*.tfstate",
    "*.tfvars",
    "service-account*.json",
)

# Content patterns that mark a file as holding a secret (searched in the whole text, one pattern at a
# time). Each starts with a literal so that ``re`` can scan for it quickly; a leading ``\b`` is written
# as a look-behind after that literal (``gh(?<!\wgh)`` is ``\bgh``): a pattern that starts with ``\b``
# makes the scan of a 300 KB file ~30 ms instead of ~0.1 ms.
# A group named ``value`` marks what ``files.redact`` hides of a match (the whole match without one);
# it never changes whether a pattern matches. A private key's value is its base64 body: the lines right
# after the BEGIN line that hold nothing else (real or JSON-escaped line breaks), up to the END line.
DEFAULT_SECRET_CONTENT_PATTERNS: tuple[str, ...] = (
    r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
    r"(?P<value>(?:(?:\s|\\[rn])*(?:[A-Za-z0-9+/]+={0,2}|(?:Proc-Type|DEK-Info):[^\n\\]*)(?=[ \t]*(?:\r?\n|\\[rn]|$)))*)",
    r"A(?<!\wA)(?:KIA|SIA|GPA|IDA|ROA|NPA|NVA)[0-9A-Z]{16}\b",  # AWS access key id
    # aws_secret_access_key, any case; found from its last "_" (a case-insensitive first literal makes
    # `re` try every position: ~100 us instead of ~8 us on a 16 KB window)
    r"_(?<=(?i:aws_secret_))(?i:access_key)\s*[:=]\s*['\"]?(?P<value>[A-Za-z0-9/+=]{40})",
    r"gh(?<!\wgh)[pousr]_[A-Za-z0-9]{36,255}\b",  # GitHub tokens
    r"github_pat_(?<!\wgithub_pat_)[A-Za-z0-9_]{22,255}\b",
    r"xox(?<!\wxox)[abposr]-[A-Za-z0-9-]{10,}\b",  # Slack tokens
    r"sk-(?<!\wsk-)(?:proj-|ant-)?[A-Za-z0-9_-]{32,}\b",  # OpenAI / Anthropic style keys
    r"AIza(?<!\wAIza)[0-9A-Za-z_-]{35}\b",  # Google API key
    r"glpat-(?<!\wglpat-)[A-Za-z0-9_-]{20,}\b",  # GitLab token
    r"\"private_key\"\s*:\s*\"(?P<value>)-----BEGIN",  # service account json (its key: the PRIVATE KEY pattern's value)
)

ALWAYS_IGNORED_DIRS: tuple[str, ...] = (".git", ".hg", ".svn")


def default_cache_root() -> Path:
    """``$DRAFTLINE_CACHE_DIR`` or ``$XDG_CACHE_HOME/draftline`` or ``~/.cache/draftline``."""
    explicit = os.environ.get("DRAFTLINE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "draftline"
    try:
        return Path.home() / ".cache" / "draftline"
    except RuntimeError:  # no HOME and no passwd entry (a container's user id): this user's temporary directory
        return Path(tempfile.gettempdir()) / f"draftline-cache-{os.getuid()}"


def workspace_key(roots: list[Path]) -> str:
    """A stable short hash of the (resolved, sorted) workspace roots."""
    joined = "\n".join(sorted(str(Path(r).resolve()) for r in roots))
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class IndexConfig:
    """Everything tunable about discovery, chunking, retrieval and storage.

    Secrets: with ``exclude_secrets`` (default True) files whose base name matches
    ``secret_name_patterns`` or whose content matches ``secret_content_patterns``
    are never read into the index. Set ``exclude_secrets=False`` to disable, or
    pass your own pattern tuples.

    Embedder: ``"model2vec"`` (default, static embedder distilled locally from
    all-MiniLM-L6-v2), ``"minilm"`` (the transformer itself, slow), ``"none"``
    (BM25 only), or a path to any sentence-transformers model directory.
    """

    cache_dir: Path | None = None  # per-workspace dir; default <cache_root>/<hash of roots>
    model_cache_dir: Path | None = None  # default <cache_root>/models
    max_file_bytes: int = 1_000_000
    extra_ignore: tuple[str, ...] = ()  # gitwildmatch patterns relative to each root
    follow_symlinks: bool = True
    # a link that resolves outside every root is skipped unless this is set: a cloned repository's link
    # to a file of the user's (~/.ssh, ~/.aws) would otherwise be read into the index and the prompts
    symlinks_outside_roots: bool = False
    exclude_secrets: bool = True
    secret_name_patterns: tuple[str, ...] = DEFAULT_SECRET_NAME_PATTERNS
    secret_content_patterns: tuple[str, ...] = DEFAULT_SECRET_CONTENT_PATTERNS
    # chunking
    max_chunk_lines: int = 60
    window_lines: int = 30
    max_chunk_chars: int = 6000
    # retrieval
    embedder: str = "model2vec"
    model2vec_dims: int = 256
    bm25_df_cutoff: float = 0.05  # drop query tokens in more than this fraction of chunks; 0 disables
    max_query_tokens: int = 256  # only the last N distinct tokens of a query are used
    rrf_k: int = 60
    fusion_depth: int = 50
    # background work
    debounce_s: float = 0.15
    embed_batch: int = 512

    def resolved_cache_dir(self, roots: list[Path]) -> Path:
        if self.cache_dir is not None:
            return Path(self.cache_dir)
        return default_cache_root() / "workspaces" / workspace_key(roots)

    def resolved_model_cache_dir(self) -> Path:
        if self.model_cache_dir is not None:
            return Path(self.model_cache_dir)
        return default_cache_root() / "models"
