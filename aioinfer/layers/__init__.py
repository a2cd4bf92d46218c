"""The building blocks of a decoder layer: linear (fused, tensor-parallel), normalization, rotary
embedding, activation, embedding and the attention layer, with torch and Triton forms. The models
compose them; they know nothing of a model's config beyond the parameters they are given."""
