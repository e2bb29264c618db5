"""Audio in the domain zoo: Whisper (conv front end, an encoder block, a decoder block with a
causal mask and cross-attention) and a wav2vec 2.0-style encoder (conv feature extractor,
positional conv, nn.TransformerEncoderLayer with a frame padding mask)."""

import torch
import torch.nn.functional as F
from domain_zoo_sizes import Sizes
from torch import nn

STRIDE = 10  # the wav2vec feature extractor's samples per frame


def whisper_inputs(s: Sizes) -> tuple:
    """A log-mel spectrogram of 2 * seq frames (conv2 halves it) and seq_k decoder tokens."""
    return torch.randn(s.batch, s.in_channels, 2 * s.seq), torch.randint(0, 50, (s.batch, s.seq_k))


def wav2vec_inputs(s: Sizes) -> tuple:
    """Raw audio of seq frames and its padding mask (1 = real sample), as Hugging Face's."""
    frames = s.padding(s.seq)
    return torch.randn(s.batch, STRIDE * s.seq), frames.repeat_interleave(STRIDE, dim=1).long()


def sinusoids(length, channels):
    scales = torch.exp(
        -torch.log(torch.tensor(10000.0)) / (channels // 2 - 1) * torch.arange(channels // 2)
    )
    times = torch.arange(length)[:, None] * scales[None, :]
    return torch.cat([times.sin(), times.cos()], dim=1)


class WhisperAttention(nn.Module):
    """whisper's MultiHeadAttention: q and k scaled by d_k ** -0.25, keys permuted to
    [B, heads, d_k, T], an additive mask."""

    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.query, self.key = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model, bias=False)
        self.value, self.out = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, x, xa=None, mask=None):
        q = self.query(x)
        k, v = self.key(x if xa is None else xa), self.value(x if xa is None else xa)
        n_ctx = q.shape[1]
        scale = (q.shape[-1] // self.heads) ** -0.25
        q = q.view(*q.shape[:2], self.heads, -1).permute(0, 2, 1, 3) * scale
        k = k.view(*k.shape[:2], self.heads, -1).permute(0, 2, 3, 1) * scale
        v = v.view(*v.shape[:2], self.heads, -1).permute(0, 2, 1, 3)
        qk = q @ k
        if mask is not None:
            qk = qk + mask[:n_ctx, :n_ctx]  # <- whisper_causal_direction
        w = F.softmax(qk, dim=-1)
        return self.out((w @ v).permute(0, 2, 1, 3).flatten(start_dim=2))


class Whisper(nn.Module):
    def __init__(self, s: Sizes, bug=None):
        super().__init__()
        d = s.d_model
        self.bug = bug
        self.conv1 = nn.Conv1d(s.in_channels, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", sinusoids(s.seq, d))
        self.enc_ln, self.enc_attn = nn.LayerNorm(d), WhisperAttention(d, s.heads)
        self.token_embedding = nn.Embedding(50, d)
        self.dec_positions = nn.Parameter(torch.randn(s.seq_k, d) * 0.02)
        self.self_ln, self.self_attn = nn.LayerNorm(d), WhisperAttention(d, s.heads)
        self.cross_ln, self.cross_attn = nn.LayerNorm(d), WhisperAttention(d, s.heads)

    def encode(self, mel):
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel))))  # [B, d, T]
        B, d, T = x.shape
        if self.bug == "whisper_frames_reshape":
            x = x.reshape(B, T, d)  # <- whisper_frames_reshape
        elif self.bug == "whisper_pos_before_permute":
            x = (x + self.positional_embedding).permute(0, 2, 1)  # <- whisper_pos_before_permute
        else:
            x = x.permute(0, 2, 1)
        if self.bug != "whisper_pos_before_permute":
            x = x + self.positional_embedding
        return x + self.enc_attn(self.enc_ln(x))

    def forward(self, mel, tokens):
        xa = self.encode(mel)
        S = tokens.shape[-1]
        y = self.token_embedding(tokens) + self.dec_positions[:S]
        mask = torch.full((S, S), float("-inf"))
        # The bug hides the past instead of the future.
        flip = self.bug == "whisper_causal_direction"
        mask = mask.tril(-1) if flip else mask.triu(1)  # <- whisper_causal_direction
        y = y + self.self_attn(self.self_ln(y), mask=mask)
        return y + self.cross_attn(self.cross_ln(y), xa)


class Wav2Vec(nn.Module):
    def __init__(self, s: Sizes, bug=None):
        super().__init__()
        d = s.d_model
        self.bug = bug
        self.conv0 = nn.Conv1d(1, d, kernel_size=5, stride=5)
        self.conv1 = nn.Conv1d(d, d, kernel_size=2, stride=2)
        self.layer_norm, self.projection = nn.LayerNorm(d), nn.Linear(d, d)
        self.pos_conv = nn.Conv1d(d, d, kernel_size=3, padding=1, groups=s.heads)
        self.layer = nn.TransformerEncoderLayer(
            d,
            s.heads,
            dim_feedforward=2 * d,
            dropout=0.0,
            batch_first=bug != "w2v_seq_first",  # <- w2v_seq_first
        )

    def forward(self, input_values, attention_mask):
        x = F.gelu(self.conv1(F.gelu(self.conv0(input_values[:, None]))))  # [B, d, T]
        x = self.projection(self.layer_norm(x.transpose(1, 2)))  # [B, T, d]
        x = x + F.gelu(self.pos_conv(x.transpose(1, 2))).transpose(1, 2)
        frames = attention_mask[:, ::STRIDE].bool()  # [B, T], True = real
        # nn.Transformer's key padding mask is True for padding; the bug passes True for real.
        padding = frames if self.bug == "w2v_mask_polarity" else ~frames  # <- w2v_mask_polarity
        return self.layer(x, src_key_padding_mask=padding)  # <- w2v_seq_first, w2v_mask_polarity
