"""The paged KV cache's bookkeeping: which fixed-size blocks of one pool each sequence owns.

A sequence's KV rows live in blocks of `block_size` tokens; its block table lists them in order.  Full
blocks are content-addressed by a hash chained over their tokens and their parent block's hash, and
reference-counted, so sequences with a common prefix share its full blocks (a second request with the
same system prompt skips that part of its prefill).  A block becomes shareable once its KV rows are
written (`written`), never while its prefill is still to run.  A block about to be written while shared is copied
first (copy-on-write).  A freed block whose content is known stays in the prefix cache until the pool
needs it (least recently freed first).  Running out of blocks is never an error here: `can_append` /
`can_allocate` say so first, and the scheduler preempts a sequence (frees its blocks) to make room.

Sliding-window layers may have a pool of their own (`WindowPool`), where a sequence holds only the blocks its
window still reads.

This is bookkeeping only: the kernels read the tables (ids into the device's pool); nothing here touches
KV memory.  Reference: tests/test_kv_blocks.py.
"""
from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from dataclasses import dataclass, field


def chain_hash(parent: bytes, tokens: list[int]) -> bytes:
    """The identity of a full block: its tokens, and (through the parent's hash) every token before it."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(struct.pack(f"<{len(tokens)}i", *tokens))
    return h.digest()


@dataclass
class SeqBlocks:
    """One sequence's view of the pool: its block table and how many of its tokens have KV rows."""
    table: list[int] = field(default_factory=list)
    n_tokens: int = 0          # tokens whose KV rows the table covers (written or shared)
    hashes: list[bytes] = field(default_factory=list)  # chained hashes of its full blocks, in order
    released: int = 0          # WindowPool: its first blocks, given back (their table entries are -1)


class BlockPool:
    """n_blocks blocks of block_size tokens each; block ids are 0..n_blocks-1."""

    def __init__(self, n_blocks: int, block_size: int):
        if n_blocks < 1 or block_size < 1:
            raise ValueError(f"a pool needs n_blocks >= 1 and block_size >= 1, got {n_blocks} and {block_size}")
        self.n_blocks, self.block_size = n_blocks, block_size
        self.refs = [0] * n_blocks
        self._free: list[int] = list(range(n_blocks - 1, -1, -1))   # never used, or freed with no known content
        self._cached: OrderedDict[int, bytes] = OrderedDict()          # free blocks with known content, LRU first
        self._by_hash: dict[bytes, int] = {}                           # hash -> block holding that content
        self._hash_of: dict[int, bytes] = {}

    # ---- queries ---------------------------------------------------------------------------------------

    @property
    def n_free(self) -> int:
        """Blocks a new allocation can take (free ones, and cached ones evicted on demand)."""
        return len(self._free) + len(self._cached)

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def cached_prefix(self, tokens: list[int]) -> int:
        """How many leading tokens of `tokens` the prefix cache holds (whole blocks; never all of them, so
        that the last token is computed and yields logits)."""
        n, parent = 0, b""
        while n + self.block_size <= len(tokens) - 1:
            parent = chain_hash(parent, tokens[n:n + self.block_size])
            if parent not in self._by_hash:
                break
            n += self.block_size
        return n

    def can_allocate(self, tokens: list[int], hit: int | None = None) -> bool:
        """Whether `allocate(tokens, hit)` would succeed now."""
        hit = self.cached_prefix(tokens) if hit is None else hit
        revived = sum(1 for b in self._prefix_blocks(tokens, hit) if self.refs[b] == 0)
        return self.blocks_for(len(tokens)) - hit // self.block_size <= self.n_free - revived

    def can_append(self, seq: SeqBlocks) -> bool:
        """Whether one more token fits: a new block, or a copy of a shared last block, when one is needed."""
        return not self._needs_block(seq) or self.n_free >= 1

    # ---- changes ---------------------------------------------------------------------------------------

    def allocate(self, tokens: list[int], hit: int | None = None) -> tuple[SeqBlocks, int]:
        """Blocks for a new sequence's prompt: shared cached blocks for its longest cached prefix (or its first
        `hit` tokens, a shorter one: what a WindowPool also holds), fresh ones for the rest.  Returns the
        sequence and how many tokens are already in the cache (its prefill starts there).  RuntimeError if the
        pool cannot hold it (ask can_allocate first)."""
        if not tokens:
            raise ValueError("allocate: a sequence needs at least one token")
        longest = self.cached_prefix(tokens)
        hit = longest if hit is None else hit
        if hit % self.block_size or not 0 <= hit <= longest:
            raise ValueError(f"allocate: a hit of {hit} tokens is not whole blocks of the {longest} cached")
        if not self.can_allocate(tokens, hit):
            raise RuntimeError(f"allocate: {len(tokens)} tokens need more blocks than the {self.n_free} free")
        seq = SeqBlocks()
        parent = b""
        for b in self._prefix_blocks(tokens, hit):
            self._take(b)
            parent = self._hash_of[b]
            seq.table.append(b)
            seq.hashes.append(parent)
        for _ in range(self.blocks_for(len(tokens)) - len(seq.table)):
            seq.table.append(self._fresh())
        seq.n_tokens = len(tokens)
        return seq, hit

    def append(self, seq: SeqBlocks, tokens: list[int]) -> tuple[int, int] | None:
        """Room for the sequence's next token (`tokens` is its whole token list, that token included).
        Returns (src, dst) when the block it writes was shared and has been copied (the caller copies the
        KV rows), else None.  RuntimeError when the pool is out of blocks (ask can_append first)."""
        if len(tokens) != seq.n_tokens + 1:
            raise ValueError(f"append: the sequence covers {seq.n_tokens} tokens, given {len(tokens)}")
        if self._needs_block(seq) and self.n_free < 1:
            raise RuntimeError("append: no free block")
        copy = None
        if seq.n_tokens % self.block_size == 0:
            seq.table.append(self._fresh())
        else:
            last = seq.table[-1]
            if self.refs[last] > 1:  # shared: copy before writing
                dst = self._fresh()
                self.refs[last] -= 1
                seq.table[-1] = dst
                copy = (last, dst)
        seq.n_tokens += 1
        return copy

    def reserve(self, seq: SeqBlocks, n: int) -> list[int]:
        """Room for the sequence's next n tokens at once (a chain of greedy steps writes them before the engine
        sees them), in fresh blocks past its last one; the last block must be its own (append has run for the
        token before).  Returns the new blocks.  RuntimeError when the pool has too few free blocks."""
        if n < 0:
            raise ValueError(f"reserve: {n} tokens")
        if seq.n_tokens % self.block_size and self.refs[seq.table[-1]] > 1:
            raise ValueError(f"reserve: {n} tokens past a shared last block")
        need = self.blocks_for(seq.n_tokens + n) - len(seq.table)
        if need > self.n_free:
            raise RuntimeError(f"reserve: {n} tokens need {need} blocks, {self.n_free} are free")
        new = [self._fresh() for _ in range(need)]
        seq.table.extend(new)
        seq.n_tokens += n
        return new

    def extend_in_place(self, seq: SeqBlocks) -> bool:
        """append's usual case in one call: the next token fits the sequence's own unshared last block, and is
        counted in; False (nothing changed) where it needs a new block or a copy (then ask can_append/append)."""
        if seq.n_tokens % self.block_size == 0 or self.refs[seq.table[-1]] > 1:  # _needs_block, inlined: per token
            return False
        seq.n_tokens += 1
        return True

    def written(self, seq: SeqBlocks, tokens: list[int], n: int) -> None:
        """The KV rows of the sequence's first n tokens are computed: its full blocks among them become
        findable by their content (prefix caching)."""
        while len(seq.hashes) < min(n, seq.n_tokens) // self.block_size:
            i = len(seq.hashes)
            parent = seq.hashes[-1] if seq.hashes else b""
            h = chain_hash(parent, tokens[i * self.block_size:(i + 1) * self.block_size])
            seq.hashes.append(h)
            b = seq.table[i]
            if h not in self._by_hash:
                self._by_hash[h] = b
                self._hash_of[b] = h

    def truncate(self, seq: SeqBlocks, n_tokens: int) -> None:
        """The sequence keeps only its first n_tokens (a speculative draft's rows past them are dropped): the
        blocks past those tokens go back, and hashes of blocks no longer full are forgotten."""
        if not 0 <= n_tokens <= seq.n_tokens:
            raise ValueError(f"truncate: {n_tokens} tokens of a sequence covering {seq.n_tokens}")
        if n_tokens < len(seq.hashes) * self.block_size:  # its next write would change a findable block
            raise ValueError(f"truncate: {n_tokens} tokens would cut a full, findable block")
        keep = self.blocks_for(n_tokens)
        tail = SeqBlocks(seq.table[keep:])
        del seq.table[keep:]
        self.free(tail)
        seq.n_tokens = n_tokens

    def fork(self, seq: SeqBlocks) -> SeqBlocks:
        """A second sequence with the same tokens (n samples of one prompt): every block shared; the first
        write to a shared partial block copies it (append)."""
        for b in seq.table:
            if b >= 0:
                self.refs[b] += 1
        return SeqBlocks(list(seq.table), seq.n_tokens, list(seq.hashes), seq.released)

    def free(self, seq: SeqBlocks) -> None:
        """Gives a finished, cancelled or preempted sequence's blocks back (newest first, so that a prefix's
        first blocks are the last evicted)."""
        for b in reversed(seq.table):
            if b >= 0:  # (-1: given back already, WindowPool)
                self._give_back(b)
        seq.table.clear()
        seq.hashes.clear()
        seq.n_tokens = seq.released = 0

    # ---- inside ----------------------------------------------------------------------------------------

    def _prefix_blocks(self, tokens: list[int], n: int) -> list[int]:
        out, parent = [], b""
        for i in range(0, n, self.block_size):
            parent = chain_hash(parent, tokens[i:i + self.block_size])
            out.append(self._by_hash[parent])
        return out

    def _needs_block(self, seq: SeqBlocks) -> bool:
        return seq.n_tokens % self.block_size == 0 or self.refs[seq.table[-1]] > 1

    def _give_back(self, b: int) -> None:
        self.refs[b] -= 1
        if self.refs[b] < 0:
            raise RuntimeError(f"free: block {b} freed more often than taken")
        if self.refs[b] == 0:
            if b in self._hash_of:
                self._cached[b] = self._hash_of[b]
            else:
                self._free.append(b)

    def _take(self, b: int) -> None:
        if self.refs[b] == 0:
            self._cached.pop(b, None)
        self.refs[b] += 1

    def _fresh(self) -> int:
        """A block with no content: a never-used or plainly freed one, else the least recently freed cached
        block (its content is forgotten)."""
        if self._free:
            b = self._free.pop()
        elif self._cached:
            b, h = self._cached.popitem(last=False)
            del self._hash_of[b]
            if self._by_hash.get(h) == b:
                del self._by_hash[h]
        else:
            raise RuntimeError("no free block")
        self.refs[b] = 1
        return b


class WindowPool(BlockPool):
    """The blocks of sliding-window layers, in a pool of their own (BatchRunner's local_tokens).  A row at
    position p reads keys p - window < j <= p only, so once a sequence's first n tokens are computed it
    needs only the blocks from the one holding position n - window on: `written` gives the earlier ones
    back (their table entries become -1; full ones stay findable by content until the pool needs them).
    Blocks are taken as rows are about to be written (`ensure`), not for a whole prompt at once, so a
    sequence holds about window / block_size + 2 blocks however long it is."""

    def __init__(self, n_blocks: int, block_size: int, window: int):
        super().__init__(n_blocks, block_size)
        if window < 1:
            raise ValueError(f"a window pool needs a window >= 1, got {window}")
        self.window = window

    def first_kept(self, n: int) -> int:
        """The first block that rows at position n and later read."""
        return max(0, n - self.window) // self.block_size

    def cached_prefix(self, tokens: list[int], limit: int | None = None) -> int:
        """The longest prefix (whole blocks, at most `limit` tokens, never every token) whose window's blocks
        the pool holds: what a sequence starting at it reads."""
        bs = self.block_size
        top = (len(tokens) - 1) // bs
        if limit is not None:
            top = min(top, limit // bs)
        hashes, parent = [], b""
        for i in range(top):
            parent = chain_hash(parent, tokens[i * bs:(i + 1) * bs])
            hashes.append(parent)
        for nb in range(top, 0, -1):
            if all(h in self._by_hash for h in hashes[self.first_kept(nb * bs):nb]):
                return nb * bs
        return 0

    def can_allocate(self, tokens: list[int], hit: int | None = None) -> bool:
        hit = self.cached_prefix(tokens) if hit is None else hit
        return sum(1 for b in self._prefix_blocks(tokens, hit) if b >= 0 and self.refs[b] == 0) <= self.n_free

    def allocate(self, tokens: list[int], hit: int | None = None) -> tuple[SeqBlocks, int]:
        """A new sequence whose first `hit` tokens are cached (default: the longest such prefix): it shares
        their window's blocks; the rest come with `ensure`."""
        if not tokens:
            raise ValueError("allocate: a sequence needs at least one token")
        longest = self.cached_prefix(tokens, hit)
        hit = longest if hit is None else hit
        if hit != longest:
            raise ValueError(f"allocate: the window of {hit} tokens is not all cached")
        seq = SeqBlocks(released=self.first_kept(hit))
        parent = b""
        for i, b in enumerate(self._prefix_blocks(tokens, hit)):
            parent = chain_hash(parent, tokens[i * self.block_size:(i + 1) * self.block_size])
            seq.hashes.append(parent)
            if b >= 0:
                self._take(b)
            seq.table.append(b)
        seq.n_tokens = hit
        return seq, hit

    def ensure(self, seq: SeqBlocks, start: int, end: int) -> list[tuple[int, int]]:
        """Rows [start, end) of the sequence are about to be written (start at most the rows it covers: a
        draft's rejected rows are written again): fresh blocks past its table, and a copy of the block at
        start if that one is shared.  Returns the copies to make, (src, dst).  RuntimeError when the pool is
        out of blocks (the engine sizes it so that it never is)."""
        bs = self.block_size
        if not seq.released * bs <= start <= seq.n_tokens or end <= start:
            raise ValueError(f"ensure: rows [{start}, {end}) of a sequence covering {seq.n_tokens}")
        new = self.blocks_for(end) - len(seq.table)
        at = start // bs
        shared = at < len(seq.table) and self.refs[seq.table[at]] > 1
        if max(new, 0) + shared > self.n_free:
            raise RuntimeError(f"the sliding-window KV pool is out of blocks ({self.n_free} free)")
        copies = []
        if shared:
            dst = self._fresh()
            self.refs[seq.table[at]] -= 1
            copies.append((seq.table[at], dst))
            seq.table[at] = dst
        for _ in range(new):
            seq.table.append(self._fresh())
        seq.n_tokens = end
        return copies

    def written(self, seq: SeqBlocks, tokens: list[int], n: int) -> None:
        """The sequence's first n tokens are computed: its full blocks become findable, and the blocks before
        its window go back."""
        super().written(seq, tokens, n)
        while seq.released < min(self.first_kept(n), len(seq.hashes)):  # full blocks (each has its hash by now)
            b = seq.table[seq.released]
            if b >= 0:
                self._give_back(b)
                seq.table[seq.released] = -1
            seq.released += 1

    def _prefix_blocks(self, tokens: list[int], n: int) -> list[int]:
        """The cached prefix's blocks, -1 for those before its window."""
        out, parent, kept = [], b"", self.first_kept(n)
        for i in range(0, n, self.block_size):
            parent = chain_hash(parent, tokens[i:i + self.block_size])
            out.append(self._by_hash[parent] if i // self.block_size >= kept else -1)
        return out
