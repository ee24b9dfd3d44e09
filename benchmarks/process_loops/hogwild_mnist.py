"""pytorch/examples' mnist_hogwild on synthetic MNIST-sized data (no torchvision, nothing downloaded): N processes
(``torch.multiprocessing``, spawn) train one shared CNN, each through its own DataLoader, with no thread setting, as
published, or ``--threads K`` (``torch.set_num_threads(K)`` as the trainer's first line). Prints each trainer's mean
batch and the wall time of the training."""
import argparse
import time

import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--processes", type=int, default=2)
parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads in each trainer (0: as published)")
parser.add_argument("--batches", type=int, default=300, help="batches each trainer trains")


class Net(nn.Module):  # the example's
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def train(rank, args, model, dataset):
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(1 + rank)
    loader = torch.utils.data.DataLoader(dataset, batch_size=64, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    model.train()
    start, done = time.perf_counter(), 0
    while done < args.batches:
        for data, target in loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            done += 1
            if done == args.batches:
                break
    print(f"trainer {rank}: {(time.perf_counter() - start) / done * 1e3:.2f} ms a batch", flush=True)


if __name__ == "__main__":
    args = parser.parse_args()
    torch.manual_seed(1)
    dataset = torch.utils.data.TensorDataset(torch.randn(6400, 1, 28, 28), torch.randint(0, 10, (6400,)))
    mp.set_start_method("spawn", force=True)
    model = Net()
    model.share_memory()
    start = time.perf_counter()
    processes = [mp.Process(target=train, args=(rank, args, model, dataset)) for rank in range(args.processes)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    print(f"trained in {time.perf_counter() - start:.2f} s")
