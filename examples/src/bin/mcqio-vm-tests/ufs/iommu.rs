//! `ufs-dma-after-unmap`: the IOMMU stops the controller writing to an
//! unmapped buffer.

use super::*;

pub(crate) fn dma_after_unmap(a: &UfsDevArgs) -> Result<(), Failure> {
    let ctrl = open(a, Some(1))?;
    let (shift, size) = lu0(&ctrl)?;
    let mut qp: UfsQueuePair = ctrl
        .create_qpair(Default::default())
        .map_err(ctx("creating a queue pair"))?;
    check_dma_after_unmap(&mut qp, ctrl.dma(), LUN, shift, size, 0x6d63_7169_6f5f_7566)?;
    qp.close(|_| {}).map_err(ctx("closing the queue pair"))
}
