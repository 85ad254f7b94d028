"""The MLA KV-cache row layout of the reference decode: 512 latent columns, then 64 rope."""

D_LATENT = 512
D_ROPE = 64
KV_ROW = D_LATENT + D_ROPE
