"""Checking a cartridge against re-reading its memories: fidelity, verify_extension and teacher forcing.

A mixin of TransformersKvBackend (transformers_backend.py): these paths read the memories as text on a plain cache
of their own and compare answers and first-token distributions with the cartridge's (base.py documents them).
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from .base import Cartridge, ExtensionCheck, FidelityReport
from .blocks import (
    chain,
    key_digest,
    num_full_blocks,
)
from .errors import ConfigError, EmptyInputError
from .format import (
    check_compatible,
    header_blocks,
)
from .kvcache import CartridgeCache, KvState

DEFAULT_FIDELITY_TOKENS = 16  # fidelity()'s answer length when the caller gives none


class CheckingMixin:
    """TransformersKvBackend's fidelity and extension checks."""

    def fidelity(
        self, cartridge: Cartridge, texts: Sequence[str], probes: Sequence[str], *, max_new_tokens: int | None = None
    ) -> FidelityReport:
        """First-token KL(text || cartridge), top-1 agreement and whole-answer identity over ``probes``.

        Answers are up to ``max_new_tokens`` tokens (None: DEFAULT_FIDELITY_TOKENS). The memories are re-read as
        text ONCE, in one forward pass on a plain cache (independent of compile's block by block prefill, its
        cache and its stored parts), not once per probe: attention is causal, so what re-reading "memories +
        question" computes for the memories does not depend on the question. Each probe is answered greedily
        from the cartridge, and the re-reading reads the question with that answer in one teacher-forced pass:
        the answers are identical iff its greedy choice is the answer's token at every position (and an EOS
        where it stopped); only its first-token distribution is needed for the KL.
        """
        check_compatible(cartridge.header, self._description)
        max_new_tokens = DEFAULT_FIDELITY_TOKENS if max_new_tokens is None else max_new_tokens
        state = self._payload(cartridge).state
        if not probes:
            raise EmptyInputError("`probes` has to be a non-empty list")
        reference = self._reread(texts)
        kls, top1, same = [], 0, 0
        for probe in probes:
            ids_c, logp_c = self._on_top(state, probe, max_new_tokens)
            identical, logp_r = self._teacher_forced(reference, probe, ids_c, max_new_tokens)
            kls.append(max(0.0, float((logp_r.exp() * (logp_r - logp_c)).sum())))  # KL(text || cartridge), noise clamped
            top1 += int(logp_r.argmax() == logp_c.argmax())
            same += int(identical)
        return FidelityReport.of_probes(kls, num_top1=top1, num_identical=same)

    def _reread(self, texts: Sequence[str]) -> KvState:
        """The memories' prompt prefix read as text in one forward pass on a plain DynamicCache (fidelity())."""
        layout = self.layout
        memories = layout.clean_memories(texts)
        ids = layout.encode(layout.prefix_text(memories))
        layout.check_split(memories, ids)
        self._check_room(len(ids), 1, "memories")
        with torch.inference_mode():
            cache = DynamicCache(config=self.model.config)
            self.model.base_model(input_ids=torch.tensor([ids], device=self.device), cache=cache, use_cache=True)
            num_layers = len(cache.layers)
            keys = [cache.layers[layer].keys.to(self.torch_dtype) for layer in range(num_layers)]
            values = [cache.layers[layer].values.to(self.torch_dtype) for layer in range(num_layers)]
            del cache
            return KvState(keys, values)

    def verify_extension(
        self,
        cartridge: Cartridge,
        texts: Sequence[str],
        probes: Sequence[str],
        *,
        num_verified_blocks: int,
        max_new_tokens: int | None = None,
        questions: Sequence[str] = (),
        answer_max_new_tokens: int = 32,
        block_secret: bytes = b"",
    ) -> ExtensionCheck:
        """Re-read the tokens after the first ``num_verified_blocks`` blocks once and compare (base.py).

        The re-reading is independent of compile(): forward passes on a plain DynamicCache holding the verified
        blocks' served KV, not PrefillCache, part_store and the payload's assembly. It reads the new tokens in the
        chunks compile reads them in (each new block on top of the ones before, then the tail), because where a
        prefill is cut changes the float sums: read in other chunks, a right cartridge would differ from its
        re-reading by float noise, and a wrong one could hide in that noise. Read in the same chunks, a right
        cartridge equals its re-reading bit for bit (f32; the gate then needs no probe decoding). Probes and
        questions are answered greedily from the cartridge; the re-reading (a KvState of
        its own, cropped back after each) reads each question with that answer in one teacher-forced pass: equal
        answers iff its greedy choice is the answer's token at every position (and an EOS where it stopped). Only a
        question whose answers differ is decoded on the re-reading too. So the new part is read once for all.
        """
        check_compatible(cartridge.header, self._description)
        if not probes:
            raise EmptyInputError("`probes` has to be a non-empty list")
        max_new_tokens = DEFAULT_FIDELITY_TOKENS if max_new_tokens is None else max_new_tokens
        header, layout = cartridge.header, self.layout
        refs = header_blocks(header)
        if isinstance(num_verified_blocks, bool) or not isinstance(num_verified_blocks, int) or not 0 <= num_verified_blocks <= len(refs):
            raise ConfigError(f"`num_verified_blocks` has to be an integer from 0 to {len(refs)} but got {num_verified_blocks!r}")
        memories = layout.clean_memories(texts)
        ids = layout.encode(layout.prefix_text(memories))
        layout.check_split(memories, ids)
        size = header.block_size
        num_blocks = num_full_blocks(len(ids), len(layout.encode(layout.closing_text())), size)
        links = chain(ids, num_blocks=num_blocks, block_size=size, key=key_digest(self._description.compat_key()), secret=block_secret)
        chain_matches = len(ids) == header.num_tokens and [ref.block_id for ref in refs] == [link for link, _ in links]
        state = self._payload(cartridge).state
        begin = num_verified_blocks * size
        started = time.perf_counter()
        with torch.inference_mode():
            cache = DynamicCache(config=self.model.config)
            if begin:
                for layer, held in zip(range(state.num_layers), cache.layers, strict=True):
                    keys, values = state.prefix(layer)
                    # views of the verified blocks (1, H, begin, D): the first update() concatenates them with the new
                    # part into a tensor of its own, so they are copied once and never written
                    held.keys, held.values, held.device, held.is_initialized = keys[:, :, :begin], values[:, :, :begin], keys.device, True
            if len(ids) > begin:
                self._check_room(len(ids), 1, "memories")
            cuts = [*range(begin, num_blocks * size, size), max(begin, num_blocks * size), len(ids)]  # compile's chunks
            for lo, hi in itertools.pairwise(cuts):
                if hi > lo:
                    self.model.base_model(input_ids=torch.tensor([ids[lo:hi]], device=self.device), cache=cache, use_cache=True)
            ref_keys = [cache.layers[layer].keys.to(self.torch_dtype) for layer in range(state.num_layers)]
            ref_values = [cache.layers[layer].values.to(self.torch_dtype) for layer in range(state.num_layers)]
            del cache
            max_abs_diff = float("inf")
            if len(ids) == state.num_tokens:
                max_abs_diff = 0.0
                for layer in range(state.num_layers if len(ids) > begin else 0):
                    keys, values = state.prefix(layer)
                    for held, reread in ((keys, ref_keys[layer]), (values, ref_values[layer])):
                        diff = (held[:, :, begin:].float() - reread[:, :, begin:].float()).abs().max()  # over (1, H, new, D)
                        max_abs_diff = max(max_abs_diff, float(diff))
        reread_s = time.perf_counter() - started
        if max_abs_diff == 0.0 and chain_matches:
            # the cartridge's KV IS the re-reading's, bit for bit: every answer from one is the answer from the other by
            # construction, so comparing them would only compare two code paths on one state. The probes are not
            # decoded; a question (an evaluation case) is answered once, from the cartridge, for the accuracy check.
            answers = []
            for question in questions:
                t0 = time.perf_counter()
                ids_c, _ = self._on_top(state, question, answer_max_new_tokens)
                answer = self._answer(ids_c, "cartridge", state.num_tokens, 0, 0.0, time.perf_counter() - t0)
                answers.append((answer, dataclasses.replace(answer, mode="text")))
            return ExtensionCheck(
                num_verified_blocks=num_verified_blocks, num_verified_tokens=begin, num_new_tokens=max(0, len(ids) - begin),
                chain_matches=chain_matches, max_abs_diff=max_abs_diff,
                fidelity=FidelityReport(num_probes=len(probes), top1_agreement=1.0, mean_kl=0.0, max_kl=0.0, answers_identical=1.0),
                answers=tuple(answers), reread_s=reread_s, probe_s=time.perf_counter() - started - reread_s, by_construction=True,
            )
        with torch.inference_mode():
            reference = KvState(ref_keys, ref_values)  # only where the probes run: the copy costs as much as the re-reading
        del ref_keys, ref_values
        kls, top1, same = [], 0, 0
        for probe in probes:
            ids_c, logp_c = self._on_top(state, probe, max_new_tokens)
            identical, logp_r = self._teacher_forced(reference, probe, ids_c, max_new_tokens)
            kls.append(max(0.0, float((logp_r.exp() * (logp_r - logp_c)).sum())))  # KL(re-read || cartridge), float noise clamped
            top1 += int(logp_r.argmax() == logp_c.argmax())
            same += int(identical)
        answers = []
        for question in questions:
            t0 = time.perf_counter()
            ids_c, _ = self._on_top(state, question, answer_max_new_tokens)
            from_cartridge = self._answer(ids_c, "cartridge", state.num_tokens, 0, 0.0, time.perf_counter() - t0)
            t0 = time.perf_counter()
            identical, _ = self._teacher_forced(reference, question, ids_c, answer_max_new_tokens)
            ids_r = ids_c if identical else self._on_top(reference, question, answer_max_new_tokens)[0]
            answers.append((from_cartridge, self._answer(ids_r, "text", reference.num_tokens, 0, 0.0, time.perf_counter() - t0)))
        return ExtensionCheck(
            num_verified_blocks=num_verified_blocks, num_verified_tokens=begin, num_new_tokens=max(0, len(ids) - begin),
            chain_matches=chain_matches, max_abs_diff=max_abs_diff, fidelity=FidelityReport.of_probes(kls, num_top1=top1, num_identical=same),
            answers=tuple(answers), reread_s=reread_s, probe_s=time.perf_counter() - started - reread_s,
        )

    def _teacher_forced(self, state: KvState, question: str, token_ids: list[int], max_new_tokens: int) -> tuple[bool, torch.Tensor]:
        """Would greedy decoding on top of ``state`` give ``token_ids``? One pass (question + those tokens), not a
        decode step per token: each position's argmax must be the next token, and where the answer stopped before
        ``max_new_tokens`` the next argmax must end it (an EOS). Returns that and the first-token log-probs."""
        logp = self._forced_logprobs(state, question, token_ids)  # row i predicts answer token i
        greedy = logp.argmax(dim=-1).tolist()
        identical = greedy[: len(token_ids)] == list(token_ids) and (len(token_ids) >= max_new_tokens or greedy[len(token_ids)] in self._eos_ids)
        return identical, logp[0]

    def _on_top(self, state: KvState, question: str, max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
        """Greedy answer to ``question`` on top of ``state`` (cropped back after): its ids and first-token log-probs."""
        suffix = self.layout.encode(self.layout.suffix_text(self.layout.clean_question(question)))
        self._check_room(state.num_tokens + len(suffix), max_new_tokens, "memories plus the question and answer")
        with torch.inference_mode(), state.scratch():
            state.ensure_capacity(state.num_tokens + len(suffix) + max_new_tokens)
            cache = CartridgeCache(state)
            try:
                out, logp, _ = self._greedy(suffix, cache, max_new_tokens, time.perf_counter())
            finally:
                cache.crop_back()
        return out, logp

    def answer_logprobs(self, cartridge: Cartridge, question: str, token_ids: Sequence[int]) -> torch.Tensor:
        """Teacher forcing: the next-token log-probs [len(token_ids) + 1, vocab] (float32) at each answer position.

        ``token_ids`` (a reference answer) are fed after the question on top of the cartridge in one pass;
        row i is the distribution for answer token i, the last row the one after the answer (precision.py).
        """
        check_compatible(cartridge.header, self._description)
        return self._forced_logprobs(self._payload(cartridge).state, question, token_ids).cpu()

    def _forced_logprobs(self, state: KvState, question: str, token_ids: Sequence[int]) -> torch.Tensor:
        """The question's suffix and ``token_ids`` fed in one pass on top of ``state`` (cropped back after): the
        next-token log-probs [len(token_ids) + 1, vocab] (float32) at each answer position."""
        ids = self.layout.encode(self.layout.suffix_text(self.layout.clean_question(question))) + [int(t) for t in token_ids]
        self._check_room(state.num_tokens + len(ids), 1, "memories plus the question and answer")
        with state.scratch(), torch.inference_mode():
            state.ensure_capacity(state.num_tokens + len(ids))
            cache = CartridgeCache(state)
            try:
                input_ids = torch.tensor([ids], device=self.device)  # (1, num_ids)
                logits = self.model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=len(token_ids) + 1).logits[0]
            finally:
                cache.crop_back()
            return torch.log_softmax(logits.float(), dim=-1)  # (len(token_ids) + 1, vocab)
