# slurm/train/: kiln-train, the data-parallel trainer on libkmtrain (a
# torchrun-style worker: kiln-run or torchrun starts one per rank; the kk
# communicator id goes through the launcher's store, hence kilnstore).
$(eval $(call kiln_bin,kiln-train,slurm/train/kiln-train.c,kmtrain kmodel kmf kk kilnstore common,$(KMF_LDLIBS) $(KK_LDLIBS)))
