"""The stage roles (producer, processor, batcher, batch processor, committer) and the
two subscription halves they are built from: the consumer and the downstream.
"""
