"""`dualpace-hw profile`: measure a box with the runtime's own executors and write the
calibration profile the simulator reads (DESIGN §4, paper §4.3 and Appendix B)."""
