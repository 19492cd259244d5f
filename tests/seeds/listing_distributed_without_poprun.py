# The PopTorch user guide's "distributed execution without PopRun" listing (10.1), as a
# user runs it: `process` below is the listing unchanged; around it, the definitions the
# listing assumes (a model returning (output, loss), ExampleDataset, model_batch_size)
# and the call with this process's id and count, here from mpirun's environment.
import os

import torch

import popdist_torch as poptorch


class ExampleDataset(torch.utils.data.Dataset):
    def __init__(self, shape, length):
        generator = torch.Generator().manual_seed(0)
        self._data = torch.randn([length, *shape], generator=generator)
        self._labels = (self._data.flatten(1).sum(1) > 0).long()

    def __len__(self):
        return len(self._labels)

    def __getitem__(self, index):
        return self._data[index], self._labels[index]


class ExampleModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 2)
        self.loss = torch.nn.CrossEntropyLoss()

    def forward(self, data, labels):
        output = self.fc(data.flatten(1))
        return output, self.loss(output, labels)


model = ExampleModel()
model_batch_size = 2


def process(process_id=0, num_processes=1):
    # Create a poptorch.Options instance to override default options
    opts = poptorch.Options()

    # Run a 100 iteration loop on the IPU, fetching a new batch each time
    opts.deviceIterations(400)

    # Replicate the graph across 2 IPUs in each process.
    opts.replicationFactor(2)

    # Set the id of the current process and the total number of processes.
    opts.Distributed.configureProcessId(process_id, num_processes)

    # Accumulate the gradient 8 times before applying it.
    opts.Training.gradientAccumulation(8)

    # Optional: All the processes must use the same seed if shuffle=True is used for the DataLoader.
    opts.randomSeed(42)

    training_data = poptorch.DataLoader(opts,
                                        dataset=ExampleDataset(shape=[3, 2],
                                                               length=100000),
                                        batch_size=model_batch_size,
                                        shuffle=True,
                                        drop_last=True)

    # Wrap the model in a PopTorch training wrapper
    poptorch_model = poptorch.trainingModel(model, options=opts)

    # Run over the training data with "batch_size" 200 essentially.
    for batch_number, (data, labels) in enumerate(training_data):
        # Execute the device with a 100 iteration loop of batchsize 8 across
        # 4 IPUs (batch-size 2 per replica). "output" and "loss" will be the
        # respective output and loss of the final batch of each replica
        # (the default OutputMode).
        output, loss = poptorch_model(data, labels)
        print(f"{batch_number} {labels[-1]}, {output}, {loss}")


if __name__ == "__main__":
    process(int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"]))
