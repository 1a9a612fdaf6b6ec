"""GPT-2's byte-level BPE in pure Python, for the tokenizer's tests and benchmark: the byte
alphabet (bytes_to_unicode), a small trainer that learns merges from a text, writers of
vocab.json and merges.txt, and a reference encoder written after OpenAI's encoder.py with
the standard `re` module (no `regex` here): letters are `[^\\W\\d_]`, numbers `\\d` and
white space an explicit class of Unicode's White_Space, so texts for the cross-check hold no
other kind of number (No, Nl: '²', '½') than decimal digits."""
import collections
import json
import re

WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
L = r"[^\W\d_]"
N = r"\d"
OTHER = rf"(?:_|(?![{WS}])\W)"
PAT = re.compile(
    rf"'s|'t|'re|'ve|'m|'ll|'d| ?{L}+| ?{N}+| ?{OTHER}+|[{WS}]+(?![^{WS}])|[{WS}]+")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


B2U = bytes_to_unicode()
U2B = {v: k for k, v in B2U.items()}


def to_alpha(bs):
    return "".join(B2U[b] for b in bs)


def from_alpha(s):
    return bytes(U2B[c] for c in s)


def pretokens(text):
    return PAT.findall(text)


def train(text, merges, sample=None):
    """Learns up to `merges` merges on the pre-tokens of text (or its first `sample`
    characters): (vocab {alpha token: id}, merges [(a, b)]), ids: the 256 bytes in byte
    order, then each merge's result. Each step merges the most frequent pair (ties: the
    smallest pair), counts kept up to date word by word, so thousands of merges take
    seconds."""
    import heapq
    words = collections.Counter(to_alpha(w.encode()) for w in pretokens(text if sample is None else text[:sample]))
    seqs = {w: list(w) for w in words}
    counts = collections.Counter()
    where = collections.defaultdict(set)
    for w, c in words.items():
        s = seqs[w]
        for i in range(len(s) - 1):
            counts[s[i], s[i + 1]] += c
            where[s[i], s[i + 1]].add(w)
    heap = [(-c, p) for p, c in counts.items()]
    heapq.heapify(heap)
    vocab = {B2U[b]: b for b in range(256)}
    out = []
    while len(out) < merges and heap:
        c, best = heapq.heappop(heap)
        if counts.get(best, 0) != -c or c == 0:
            continue  # stale
        a, b = best
        out.append(best)
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
        changed = set()
        for w in list(where.pop(best, ())):
            s, n = seqs[w], words[w]
            for i in range(len(s) - 1):
                counts[s[i], s[i + 1]] -= n
                changed.add((s[i], s[i + 1]))
            i, t = 0, []
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    t.append(a + b)
                    i += 2
                else:
                    t.append(s[i])
                    i += 1
            seqs[w] = t
            for i in range(len(t) - 1):
                p = (t[i], t[i + 1])
                counts[p] += n
                where[p].add(w)
                changed.add(p)
        counts.pop(best, None)
        for p in changed:  # every changed count gets an entry; the old ones are stale
            if counts.get(p, 0) > 0:
                heapq.heappush(heap, (-counts[p], p))
    return vocab, out


def write(folder, vocab, merges):
    """vocab.json and merges.txt in folder (a pathlib.Path): their two paths."""
    v, m = folder / "vocab.json", folder / "merges.txt"
    v.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    m.write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    return v, m


class Encoder:
    """OpenAI's encoder.py: bpe() on each pre-token, with its cache."""

    def __init__(self, vocab, merges):
        self.encoder = vocab
        self.decoder = {i: t for t, i in vocab.items()}
        self.ranks = dict(zip(merges, range(len(merges))))
        self.cache = {}

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
        while pairs:
            bigram = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if bigram not in self.ranks:
                break
            first, second = bigram
            new, i = [], 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    new.extend(word[i:])
                    break
                new.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new.append(first + second)
                    i += 2
                else:
                    new.append(word[i])
                    i += 1
            word = tuple(new)
            if len(word) == 1:
                break
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
        self.cache[token] = word
        return word

    def encode(self, text):
        ids = []
        for tok in pretokens(text):
            ids.extend(self.encoder[t] for t in self.bpe(to_alpha(tok.encode("utf-8"))))
        return ids

    def decode(self, ids):
        return b"".join(from_alpha(self.decoder[i]) for i in ids)
