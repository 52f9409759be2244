"""Plain English text the built-in default model's tokenizer is trained on.

Written for writescope (no third-party text). It only has to give a byte-level BPE a sensible set
of English merges; changing it changes the default model, so bump ``DEFAULT_MODEL_VERSION`` in
``writescope/models/default.py`` whenever this text changes.
"""

CORPUS = """\
The morning was cold and clear. A thin layer of frost covered the grass, and the river below the
town moved slowly under a sky that had not yet decided whether to rain. Anna walked to the station
with her hands in her pockets, counting the minutes until the first train. She had made the same
walk every day for three years, and she knew every house on the way: the blue door with the brass
handle, the garden full of roses that nobody seemed to water, the small bakery where the owner was
always already awake, pulling bread out of the oven while the rest of the street was still asleep.

When the train arrived she found a seat by the window. The carriage was almost empty. An old man
read a newspaper, folding each page carefully before he turned it, and a young student slept with
her head against the glass. Anna opened her notebook and began to write. She wrote about the frost
and the river, about the bakery and the bread, and about the strange feeling that the day was
waiting for something to happen. Writing helped her think. It turned the noise in her head into
sentences, and sentences could be read, changed, and understood.

Hello! How can I help you today? I can answer questions, explain ideas, write short stories, or
help you plan your work. Please tell me what you need, and I will do my best. If I do not know the
answer, I will say so. Thank you for your question. Here is a short answer, followed by a longer
explanation with an example. Let me know if you would like more detail, a simpler version, or a
list of sources that you can read on your own.

A computer runs programs by reading instructions from memory and executing them one after another.
The processor is fast, but memory is slow, so modern machines keep small caches close to the
processor. A cache stores recent data so that the next access is quick. When the data a program
needs is not in the cache, the processor must wait while it is fetched from main memory. This wait
is called a cache miss, and programs that avoid cache misses can run many times faster than
programs that do not. Good software is often designed around the way memory is read and written.

A graphics processor, or GPU, has thousands of small cores and a very wide connection to its own
memory. It is excellent at doing the same operation on large blocks of numbers at the same time.
That is why GPUs are used to train and run neural networks. A language model is a neural network
that predicts the next word, or more exactly the next token, from the words that came before. To
generate text it predicts one token, adds it to the sequence, and predicts again. Each step reads
all of the model's weights and the stored keys and values of every earlier token.

The stored keys and values are called the KV cache. For a long document the cache can grow larger
than the model itself. When the GPU does not have enough memory, part of the cache can be kept in
the main memory of the host computer. The data can then be copied to the GPU over the PCIe bus, or
the host processor can compute the attention itself, close to where the data lives. Both paths can
work at the same time. The question is how to split the work so that neither path waits for the
other, and how to decide where each new block of the cache should be written.

A mixture of experts model contains many small feed forward networks, called experts, in each
layer. A router looks at every token and chooses a few experts to process it. Only the chosen
experts do any work, so the model can have a very large number of parameters while each token uses
only a small part of them. The experts that are not needed for a token are simply skipped. This
makes the model cheaper to run, but it also means that all of the experts must be stored somewhere,
and they may not fit in the memory of a single GPU.

In the spring the town held a market in the square. Farmers came from the villages with eggs,
cheese, honey, and baskets of early vegetables. Children ran between the stalls, and musicians
played near the fountain. People who had not spoken all winter stood together in the sun and
talked about the weather, the price of flour, and the new bridge that the council had promised to
build for the last ten years. Nobody believed the bridge would ever be built, but everyone liked
to talk about it, because it was something they could agree on.

To make a simple soup, cut two onions, three carrots, and a few potatoes into small pieces. Warm
some oil in a large pot and cook the onions until they are soft. Add the carrots and potatoes, pour
in enough water or stock to cover them, and add a pinch of salt. Let the soup simmer for about
twenty minutes, until the vegetables are tender. You can blend it until it is smooth or leave it as
it is. Serve it hot with fresh bread. The soup keeps well for two or three days in a cool place.

The history of science is full of ideas that seemed obvious once someone had found them. People
watched apples fall for thousands of years before anyone asked why the moon did not fall too.
Good questions are often more valuable than quick answers. A careful experiment can show that a
popular idea is wrong, and a simple measurement, repeated many times, can reveal a pattern that
nobody expected. Scientists share their methods so that others can check the results, and an
idea becomes trusted only after many people have tried to break it and failed.

Writing clear code is like writing clear prose. Choose names that say what a thing is for. Keep
each function short enough to read in one sitting, and make it do one job well. Test the parts
that are easy to get wrong, such as the edges of a range, an empty list, or a number that is too
large. When something fails, the error message should say what went wrong, where, and what the
user can do about it. Code is read far more often than it is written, so the time spent making it
readable is never wasted.

The children asked their grandfather for a story, and he told them about a fox who wanted to learn
to fly. The fox watched the birds every day and copied everything they did. He flapped his front
legs, he jumped from the top of a wall, and he sat in a tree and waited for the wind. The birds
laughed at him, but one small sparrow felt sorry for the fox and decided to help. The sparrow
could not teach him to fly, of course, but she taught him to climb the highest hill in the forest,
where he could see the whole valley, and the fox was happy, because that was what he had wanted.

What is the capital of France? The capital of France is Paris. What is two plus two? Two plus two
is four. How many days are there in a week? There are seven days in a week: Monday, Tuesday,
Wednesday, Thursday, Friday, Saturday, and Sunday. Which planet is closest to the sun? Mercury is
the planet closest to the sun. Why is the sky blue? Sunlight is scattered by the air, and blue
light is scattered more than red light, so the sky looks blue during the day.

Numbers appear everywhere: 1, 2, 3, 10, 42, 100, 256, 1024, 2048, 4096, and 65536. A year has 12
months and 365 days, or 366 in a leap year. The temperature today is 18 degrees, the train leaves
at 7:45, and the meeting starts at 9:30. The report is due on 2024-06-01. The file is 3.5 MB, the
model has 30 billion parameters, and the batch holds 8 sequences of 16K tokens each.
"""
