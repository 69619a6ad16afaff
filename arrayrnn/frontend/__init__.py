"""The fused sequence op every engine shares: ``rnn_forward`` / ``rnn_backward`` (:mod:`.rnn`), with the
inter-layer dropout masks (:mod:`.dropout`) and the guard against weights written between forward and
backward (:mod:`.guard`)."""
