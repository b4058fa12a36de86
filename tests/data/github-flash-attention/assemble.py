"""Assemble GitHub REST API answers for Dao-AILab/flash-attention from a git snapshot of it (api.github.com did not
resolve from the machine that recorded tests/data/upstream-2026-12-05). Every value (commit ids, dates, subjects,
tree ids) is git's; the shape is the one GitHub documents (docs.github.com/en/rest/commits/commits#list-commits,
/rest/git/trees#get-a-tree), trimmed to the fields toolkit/knowledge/upstream_answers.py reads plus author/tree.

    python tests/data/github-flash-attention/assemble.py /path/to/flash-attention.git OUT_DIR
"""

import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

REPO = "Dao-AILab/flash-attention"
API = f"https://api.github.com/repos/{REPO}"
# (path, since): the queries the tests replay: hopper/ since the commit before the pin, flash_attn/ since the pin
QUERIES = [("hopper", "2026-07-27"), ("flash_attn", "2026-07-29")]


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def utc(iso: str) -> str:
    return datetime.fromisoformat(iso).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def commits(repo: str, path: str, since: str) -> list[dict]:
    out = []
    log = git(repo, "log", "main", f"--since={since}T00:00:00Z", "--format=%H%x00%T%x00%an%x00%aI%x00%cn%x00%cI%x00%B%x1e",
              "--", path)
    for record in filter(str.strip, log.split("\x1e")):
        sha, tree, an, ad, cn, cd, message = record.strip("\n").split("\x00")
        out.append({"sha": sha, "commit": {"author": {"name": an, "date": utc(ad)},
                                           "committer": {"name": cn, "date": utc(cd)},
                                           "message": message.strip(), "tree": {"sha": tree}}})
    return out


def tree(repo: str, ref: str) -> dict:
    entries = []
    for line in git(repo, "ls-tree", ref).splitlines():
        meta, path = line.split("\t", 1)
        mode, kind, sha = meta.split()
        entries.append({"path": path, "mode": mode, "type": kind, "sha": sha})
    return {"sha": git(repo, "rev-parse", f"{ref}^{{tree}}").strip(), "tree": entries, "truncated": False}


def main(repo: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    answers = {f"{API}/git/trees/main": tree(repo, "main")}
    for path, since in QUERIES:
        answers[f"{API}/commits?path={path}&since={since}T00:00:00Z&per_page=100"] = commits(repo, path, since)
    head = git(repo, "log", "-1", "--format=%H %cI", "main").split()
    index = {}
    for n, (url, body) in enumerate(answers.items()):
        name = f"answer{n}.json"
        (out / name).write_text(json.dumps(body, indent=1) + "\n")
        index[url] = {"file": name, "recorded": utc(head[1]),
                      "trimmed": f"assembled from git at main {head[0]} (GitHub's shape, git's values)"}
    (out / "index.json").write_text(json.dumps({"schema": 2, "answers": index}, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
