"""Building blocks more than one model family uses, in a home neither family owns.

    base.py         CastingLayer: a layer that casts its own inputs and variables
    attention.py    attention masks, scaled dot-product attention, MultiHeadAttention
                    (fused projections, key/value cache for decoding)
    feed_forward.py FeedForward: dense -> activation -> dropout -> dense
    blocks.py       EncoderLayer and DecoderLayer: the residual blocks of Vaswani et
                    al. (2017), pre-LN or post-LN, and their LayerNorm (`norm_layer`)
    fused.py        LayerNorm and GELU with hand-written gradients

The text family's sequence models and the vision family's ViT both build on these;
nothing here imports a family.
"""
