"""Hugging Face Hub model ids, hf://ORG/NAME[@REVISION][/PATH], resolved to a local directory.

Wherever a model directory goes (init_from, evaluate --checkpoint), a Hub id may stand instead: the
command resolves it once, when it resolves its config, to the snapshot that huggingface_hub keeps in
its cache (HF_HUB_CACHE), and everything below reads that directory as it reads any other. The
library's own settings apply: HF_HUB_OFFLINE=1 reads the cache only, HF_TOKEN opens private and
gated repositories, a revision is a branch, a tag or a commit. Only the files a model directory
needs are downloaded (config, weights, vocabulary, tokenizer, card).

A missing repository or revision, or one that is neither on the Hub (when it cannot be reached)
nor in the cache, is a one-line ConfigError naming it. The Hub's first answer is awaited at most
HF_HUB_ETAG_TIMEOUT seconds (huggingface_hub's setting, default 10); without an answer the cache
is used.
"""

from __future__ import annotations

import os

from albert_jax.base.config_lib import ConfigError
from albert_jax.base.log import log

PREFIX = "hf://"
# What a Hugging Face ALBERT directory or one of our exports holds (a repository's other files, such
# as TensorFlow or ONNX weights, are not downloaded).
MODEL_FILES = (
  "config.json",
  "*.safetensors",
  "*.safetensors.index.json",
  "spiece.model",
  "tokenizer.json",
  "tokenizer_config.json",
  "special_tokens_map.json",
  "README.md",
)
TORCH_WEIGHTS = "pytorch_model.bin"  # older repositories' only weights


def is_hub_id(path) -> bool:
  return isinstance(path, str) and path.startswith(PREFIX)


def resolve(path: str, what: str, announce=log) -> str:
  """`path` itself, or for an hf:// id the local directory of its snapshot (downloaded when not in
  the cache), `announce`d in a line. `what` names the setting in errors (e.g. "init_from")."""
  if not is_hub_id(path):
    return path
  try:
    import huggingface_hub
  except ImportError:
    raise ConfigError(
      f"{what}={path}: the huggingface_hub package is not installed (pip install -e '.[hub]')"
    ) from None
  from huggingface_hub import errors

  try:
    uri = huggingface_hub.parse_hf_uri(path)
  except errors.HfUriError as e:
    raise ConfigError(f"{what}={path} is not a Hub id hf://ORG/NAME[@REVISION] ({e.msg})") from None
  if uri.type != "model":
    raise ConfigError(f"{what}={path} is a {uri.type} repository, not a model")
  name = f"{uri.id}" + (f"@{uri.revision}" if uri.revision else "")
  sub = uri.path_in_repo.strip("/")
  patterns = [f"{sub}/{p}" if sub else p for p in MODEL_FILES]
  commit, siblings = _ask_the_hub(huggingface_hub, uri, what, path, announce)
  # The PyTorch weights only where the repository has no safetensors ones (offline: whatever the
  # cache holds).
  if siblings is None or not any(f.endswith(".safetensors") for f in siblings):
    patterns.append(f"{sub}/{TORCH_WEIGHTS}" if sub else TORCH_WEIGHTS)
  try:
    local = huggingface_hub.snapshot_download(
      uri.id,
      revision=commit or uri.revision,
      allow_patterns=patterns,
      local_files_only=commit is None,  # the Hub did not answer: the cache only
    )
  except (errors.RevisionNotFoundError, errors.RepositoryNotFoundError) as e:
    raise _missing(e, uri, what, path) from None
  except errors.IncompleteSnapshotError as e:
    raise ConfigError(
      f"{what}={path}: the cached snapshot of {name} is incomplete ({_first_line(e)})"
    ) from None
  except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled, FileNotFoundError):
    raise ConfigError(_not_cached(path, uri, what)) from None
  except errors.HfHubHTTPError as e:
    raise ConfigError(f"{what}={path}: the Hub refused the download ({_first_line(e)})") from None
  local = os.path.join(local, sub) if sub else local
  if not os.path.isdir(local):
    raise ConfigError(f"{what}={path}: {name} has no folder {sub}")
  announce(f"{what}: {path} is {local}")
  return local


def _missing(e, uri, what: str, path: str) -> ConfigError:
  """The one-line error for a repository (RepositoryNotFoundError) or a revision
  (RevisionNotFoundError) that the Hub does not have."""
  from huggingface_hub import errors

  if isinstance(e, errors.RevisionNotFoundError):
    return ConfigError(f"{what}={path}: the repository {uri.id} has no revision {uri.revision}")
  return ConfigError(_not_found(path, uri, what))


def _ask_the_hub(huggingface_hub, uri, what: str, path: str, announce):
  """(the revision's commit, the repository's files) from the Hub; (None, None) offline
  (HF_HUB_OFFLINE) or when it does not answer in HF_HUB_ETAG_TIMEOUT seconds: the cache decides.
  A repository or revision the Hub does not have is a ConfigError."""
  from huggingface_hub import constants, errors

  if constants.HF_HUB_OFFLINE:
    return None, None
  try:
    info = huggingface_hub.HfApi().model_info(
      uri.id, revision=uri.revision, timeout=constants.HF_HUB_ETAG_TIMEOUT
    )
  except (errors.RevisionNotFoundError, errors.RepositoryNotFoundError) as e:
    raise _missing(e, uri, what, path) from None
  except Exception as e:  # noqa: BLE001 (unreachable, timed out, refused: the cache may hold it)
    announce(f"{what}: the Hub did not answer for {uri.id} ({_first_line(e)}); using the cache")
    return None, None
  return info.sha, [s.rfilename for s in (info.siblings or [])]


def _not_found(path: str, uri, what: str) -> str:
  return (
    f"{what}={path}: no repository {uri.id} on the Hub (or it is private or gated and HF_TOKEN "
    f"gives no access to it)"
  )


def _not_cached(path: str, uri, what: str) -> str:
  """Offline (or the Hub unreachable) and not in the cache: which part is missing, and where."""
  from huggingface_hub import constants
  from huggingface_hub.file_download import repo_folder_name

  cache = constants.HF_HUB_CACHE
  folder = os.path.join(cache, repo_folder_name(repo_id=uri.id, repo_type="model"))
  why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the Hub cannot be reached"
  if not os.path.isdir(folder):
    return (
      f"{what}={path}: the repository {uri.id} is not in the Hugging Face cache {cache} ({why})"
    )
  return (
    f"{what}={path}: the revision {uri.revision or 'main'} of {uri.id} is not in the Hugging Face "
    f"cache {cache} ({why})"
  )


def _first_line(e: BaseException) -> str:
  lines = [l.strip() for l in str(e).splitlines() if l.strip()]
  return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
