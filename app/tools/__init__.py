"""Measuring tools run from the command line (`fencepost bench`, `fencepost
soak`) and the workflows they run. The API and the worker never import this
package: the runtime does not carry the tools' workflows or their code."""
