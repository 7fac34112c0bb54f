"""The private names of TensorFlow and Keras that hpctf relies on, each behind one module with
the versions it was checked against, probed at start, never assumed."""
